"""Smoke run of the plant-family benchmark: two seeds and the 40-unit case, tiny image counts."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark


@pytest.mark.slow
def test_plant_family_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "plant_family.py", tmp_path, "--seeds=2", "--first=5", "--n-images=24", "--n-fresh=8"
    )
    assert [r["seed"] for r in data["rows"]] == [5, 6]
    assert data["large"]["n_causal"] == 40
    s = data["summary"]
    assert s["n_seeds"] == 2 and sum(s["outcomes"].values()) == 2
    for row in [*data["rows"], data["large"]]:
        assert row["outcome"] in ("exact", "clean_incomplete", "partial", "refused", "wrong")
        assert row["seconds"] > 0
        if row["outcome"] != "refused":
            assert row["forwards"] > 0 and 0 <= row["recall"] <= 1
    assert data["settings"]["seeds"] == 2 and "environment" in data
