"""Smoke run of the variant speed benchmark with tiny settings (issue 6)."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark


@pytest.mark.slow
def test_variant_speed_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "variant_speed.py",
        tmp_path,
        "--model=deit3_small_patch16_224",
        "--img-size=32",
        "--depth=3",
        "--batch-size=2",
        "--repeats=2",
        "--warmup=1",
    )
    assert data["variant"]["specialize"] == ["norm", "ls", "qkv"]
    assert data["variant"]["qkv_blocks"] == [0]
    extra = data["params"]["extra"]
    assert extra["norm"] == 3 * 2 * 2 * 384 and extra["ls"] == 3 * 2 * 384
    assert extra["qkv"] == 3 * 384 * 384 + 3 * 384
    assert data["flops"]["delta"]["specialisation"] == 0
    assert len(data["seconds"]["baseline"]) == len(data["seconds"]["variant"]) == 2
    ips = data["images_per_s"]
    assert data["ratio_variant_over_baseline"] == pytest.approx(ips["variant"] / ips["baseline"])
    assert data["target_ratio"] == 0.95 and any("qkv" in line for line in data["params_lines"])
