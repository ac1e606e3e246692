"""Smoke run of the fix_speed benchmark with tiny settings."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark


@pytest.mark.slow
def test_fix_speed_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "fix_speed.py",
        tmp_path,
        "--img-size=32",
        "--depth=3",
        "--methods=naclip,ttr+naclip",
        "--batch-size=2",
        "--repeats=2",
        "--warmup=1",
    )
    rows = data["methods"]
    assert list(rows) == ["naclip", "ttr+naclip"]
    assert rows["naclip"]["last_block_method"] and rows["naclip"]["meets_target"] in (True, False)
    assert rows["ttr+naclip"]["meets_target"] is None
    assert len(rows["naclip"]["seconds"]["fixed"]) == 2
    med = rows["naclip"]["median_s"]
    assert rows["naclip"]["ratio_fixed_over_bare"] == pytest.approx(med["bare"] / med["fixed"])
    assert data["target_ratio"] == 0.9
