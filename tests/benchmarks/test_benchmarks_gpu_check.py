"""Smoke run of the GPU check's benchmark on its CPU fallback path (tiny sizes)."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark


@pytest.mark.slow
def test_gpu_check_cpu_fallback_smoke(tmp_path: Path) -> None:
    data = run_benchmark("gpu_check.py", tmp_path, "--device=cpu", "--tiny")
    assert data["settings"]["device"] == "cpu" and data["environment"]["device"] == "cpu"
    runs = [(r["model"], r["precision"]) for r in data["results"]]
    assert runs == [("vit_tiny_patch16_224", "fp32"), ("vit_tiny_patch16_224", "bf16")]
    for r in data["results"]:
        for key in data["targets"]:
            m = r[key]
            assert m["ratio"] == pytest.approx(m["seconds_a"] / m["seconds_b"]) and m["ratio"] > 0
