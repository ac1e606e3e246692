"""``vitreg compare``: the long format fits 100 columns, folders that are not runs are skipped
with a note, and comparison.md / report.html / comparison.json hold the wide table and curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.cli.output import console
from vitreg.report.compare import compare_runs, long_rows, write_compare
from vitreg.results.comparison import Comparison
from vitreg.results.schema import RunDocument

OLD_RUN = Path(__file__).parent / "schema_1_1_diagnose.json"
LONG = "base/blocks.11.hook_resid_post/test_time_registers/all/top1"


def fake_run(folder: Path, spec: str, rate: float, ratios: list[float]) -> Path:
    """A diagnose metrics.json (the saved 1.1 run's results) with these per-layer norms and
    long metric names."""
    results = json.loads(OLD_RUN.read_text())["results"]
    first = results["norms"]["layers"][0]
    results["norms"]["layers"] = [
        {**first, "layer": i, "outlier_rate": {"auto": rate * (i > 0)}, "max_over_median": r}
        for i, r in enumerate(ratios)
    ]
    doc = {
        "schema_version": "1.1",
        "verb": "diagnose",
        "command": f"vitreg diagnose {spec}",
        "model": {"spec": spec},
        "results": results,
        "metrics": [
            {"name": "outlier_rate", "value": rate, "higher_is_better": False},
            {"name": LONG, "value": 0.5 + rate, "higher_is_better": True},
            {"name": "artifacts_present", "value": rate > 0, "higher_is_better": False},
        ],
    }
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    a = fake_run(tmp_path / "20261201-120000_planted-dinov2_s14_diagnose", "a", 0.04, [2, 30, 40])
    b = fake_run(tmp_path / "20261201-120500_planted-deit3_s16_diagnose", "b", 0.0, [2, 3, 3.5])
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.json").write_text("{")
    return [a, tmp_path / "empty", b, broken]


def test_not_runs_are_skipped_with_the_reason(runs: list[Path]) -> None:
    merged = compare_runs(runs)
    assert isinstance(merged, Comparison) and len(merged.documents) == 2
    assert all(isinstance(d, RunDocument) for d in merged.documents)
    assert merged.runs == [runs[0].name, runs[2].name]
    assert set(merged.skipped) == {str(runs[1]), str(runs[3])}
    assert "no metrics.json" in merged.skipped[str(runs[1])]
    assert "not valid JSON" in merged.skipped[str(runs[3])]
    rows = long_rows(merged)
    assert len(rows) == 6 and rows[0].run == runs[0].name
    assert {r.direction for r in rows} == {"higher is better", "lower is better"}


def test_files_hold_the_wide_table_and_the_curves(runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    write_compare(out, compare_runs(runs), "svg")
    md = (out / "comparison.md").read_text()
    assert f"| metric | {runs[0].name} | {runs[2].name} |" in md
    assert f"| `{LONG}` ↑ | 0.54 | 0.5 |" in md
    assert "figures/model_curves.png" in md and "empty" in md  # the skipped folder is noted
    assert (out / "figures" / "model_curves.png").is_file()
    assert (out / "figures" / "model_curves.svg").is_file()
    html = (out / "report.html").read_text()
    assert "data:image/webp;base64," in html and "<code>" in html and "`" not in html
    data = json.loads((out / "comparison.json").read_text())
    assert data["verb"] == "compare" and len(data["rows"]) == 3


def test_console_long_format_fits_100_columns(
    runs: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console, "width", 100)
    result = CliRunner().invoke(app, ["compare", *map(str, runs)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 100, "\n".join(lines)
    assert "skipped" in result.output and "broken" in result.output
    assert LONG.split("/")[-1] in result.stdout and "lower is better" in result.stdout
    none = CliRunner().invoke(app, ["compare", str(runs[1])])
    assert none.exit_code == 2 and "none of the 1 paths is a run" in " ".join(none.output.split())


def test_comparison_json_is_read_back_typed(runs: list[Path], tmp_path: Path) -> None:
    from vitreg.errors import InputError
    from vitreg.report.documents import read_comparison

    out = tmp_path / "cmp"
    merged = compare_runs(runs)
    write_compare(out, merged, command="vitreg compare a b")
    saved = json.loads((out / "comparison.json").read_text())
    read = read_comparison(out)
    assert isinstance(read, Comparison) and read.has_provenance
    assert read.rows == merged.rows and read.command == "vitreg compare a b"
    again = read.model_dump(mode="json")
    assert again == saved and list(again) == list(saved)  # the fields and their order as written
    assert merged.notes and list(saved)[-2:] == ["skipped", "notes"]
    saved["rows"][0]["values"] = "not a list"
    (out / "comparison.json").write_text(json.dumps(saved))
    with pytest.raises(InputError, match=r"comparison.json: rows\.0\.values"):
        read_comparison(out)


def test_a_compared_run_is_read_as_written(tmp_path: Path) -> None:
    from vitreg.report.documents import read_metrics

    doc = {"verb": "probe", "extra": [1, {"a": None}], "metrics": [{"name": "m", "value": True}]}
    (tmp_path / "metrics.json").write_text(json.dumps(doc))
    read = read_metrics(tmp_path)
    assert isinstance(read, RunDocument) and read.metrics[0].value is True
    assert read.metrics[0].higher_is_better is None and read.model is None
    assert read.read == doc  # no field added (a missing direction stays missing for the schema)
