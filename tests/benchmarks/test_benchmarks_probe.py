"""Smoke run of the probe-training benchmark with tiny settings (issue 5)."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark

TINY = [
    "--n-tokens=300",
    "--dim=16",
    "--n-lrs=2",
    "--classes=5",
    "--epochs=2",
    "--batch-size=64",
    "--model=vit_small_patch16_224",
    "--img-size=32",
    "--depth=1",
    "--extract-batch-size=2",
    "--extract-batches=2",
]


@pytest.mark.slow
def test_probe_training_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark("probe_training.py", tmp_path, *TINY)
    assert data["benchmark"] == "probe_training"
    assert data["settings"]["n_tokens"] == 300 and data["settings"]["n_lrs"] == 2
    train, ext = data["training"], data["extraction"]
    assert train["epochs_run"] == [2, 2] and len(train["lrs"]) == 2
    assert train["seconds"] > 0 and train["seconds_per_epoch"] == pytest.approx(
        train["seconds"] / 2
    )
    assert ext["tokens_per_image"] == 5  # [CLS] + 2×2 patches at 32 px
    assert ext["n_images"] == 60 and len(ext["seconds_per_batch"]) == 2
    assert ext["estimated_seconds"] == pytest.approx(ext["seconds_per_image"] * 60)
    assert "median s/image × 60 images" in ext["method"]
    ratio = train["seconds"] / ext["estimated_seconds"]
    assert data["ratio_training_over_extraction"] == pytest.approx(ratio)
    assert data["meets_target"] == (ratio < 1)
    assert data["environment"]["torch_threads"] >= 1
