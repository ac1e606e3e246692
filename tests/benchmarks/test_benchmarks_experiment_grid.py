"""Smoke run of the experiment-grid benchmark with the smallest training."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark


@pytest.mark.slow
def test_experiment_grid_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "experiment_grid.py",
        tmp_path,
        "--data=synthetic:n=8,size=48",
        "--steps=1",
        "--only=baseline-none",
    )
    assert data["complete"] is True and data["variants"] == ["baseline-none"]
    assert data["seconds"] > 0 and data["target_seconds"] == 1200
    assert data["settings"]["preset"] == "tiny" and data["settings"]["steps"] == 1
