"""Smoke runs, with tiny settings, of the issue-22 figures: the feature cache against a plain
forward (cache_speed.py) and diagnose's memory over two image counts (trace_memory.py
--diagnose)."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark

TINY = ["--img-size=28", "--depth=2", "--batch-size=2"]


@pytest.mark.slow
def test_cache_speed_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark("cache_speed.py", tmp_path, *TINY, "--n-images=3", "--repeats=1")
    assert len(data["seconds"]["plain"]) == len(data["seconds"]["cache"]) == 1
    median = data["median_s"]
    assert data["throughput_ratio"] == pytest.approx(median["plain"] / median["cache"])
    assert data["target"] == 0.8 and "load_average_1m" in data["environment"]


@pytest.mark.slow
def test_trace_memory_diagnose_smoke(tmp_path: Path) -> None:
    data = run_benchmark("trace_memory.py", tmp_path, *TINY, "--n-images=2,4", "--diagnose")
    assert [r["n_images"] for r in data["runs"]] == [2, 4]
    assert all(r["diagnose"] for r in data["runs"]) and data["settings"]["diagnose"]
    assert data["peak_growth_mb"] == data["runs"][1]["peak_rss_mb"] - data["runs"][0]["peak_rss_mb"]
