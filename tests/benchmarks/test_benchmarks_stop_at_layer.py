"""Smoke run of the stop_at_layer benchmark with tiny settings."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark


@pytest.mark.slow
def test_stop_at_layer_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "stop_at_layer.py",
        tmp_path,
        "--img-size=32",
        "--depth=4",
        "--layer=0",
        "--batch-size=2",
        "--repeats=2",
        "--warmup=1",
    )
    assert data["site"] == "blocks.0.hook_resid_post" and data["stop_at_layer"] == 1
    assert data["blocks_run"] == {"full": 4, "stopped": 1}
    assert data["activations_equal"] is True
    assert len(data["seconds"]["full"]) == len(data["seconds"]["stopped"]) == 2
    med = data["median_s"]
    assert data["ratio_full_over_stopped"] == pytest.approx(med["full"] / med["stopped"])
    assert data["target_ratio"] == 3.0 and data["settings"]["layer"] == 0
