"""Smoke run of the export_speed benchmark with tiny settings."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark


@pytest.mark.slow
def test_export_speed_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "export_speed.py",
        tmp_path,
        "--quick",
        "--n-images=4,10",
        "--img-size=56",
        "--depth=3",
        "--shard-size=4",
    )
    small, large = data["runs"]
    assert (small["n_images"], large["n_images"]) == (4, 10)
    assert large["n_shards"] == 3 and large["layers"] == ["1", "2"]  # blocks 1, 1, 2 of 3
    assert large["bytes_written"] > 0 and large["write_mb_per_s"] > 0
    ratios = [r["plain_cpu_s"] / r["export_cpu_s"] for r in data["runs"]]
    assert data["ratio_export_over_plain"] == pytest.approx(min(ratios))
    assert data["peak_growth_mb"] == pytest.approx(large["peak_rss_mb"] - small["peak_rss_mb"])
