"""`vitreg report RUN` renders a saved run again to the bytes its first rendering wrote, for a
golden run of every verb, both kinds of comparison, the fix leaderboard and the older schemas:
tests/report/_golden/ holds, per run, what re-rendering reads (the document, figures/, a
comparison's runs) and the pages the run wrote. _golden/make_runs.py makes them again (by hand,
when a change of the reports is meant: the diff of its pages is the change)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.results.schema import SCHEMA_VERSION, VERBS

GOLDEN = Path(__file__).parent / "_golden"
RUNS = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir() and p.name[0] not in "._")
PAGES = ("report.md", "comparison.md", "leaderboard.md", "report.html")
SHOWN = 80  # characters shown on each side of the first difference in a line
runner = CliRunner()


def kind(run: Path) -> str:
    """What made a golden run: its verb (a comparison: which command), and its schema."""
    if (run / "leaderboard.json").is_file():
        return "leaderboard"
    if (run / "comparison.json").is_file():
        verb = json.loads((run / "comparison.json").read_text())["verb"]
        return "comparison: " + {"diagnose": "diagnose --models", "compare": "compare"}[verb]
    doc = json.loads((run / "metrics.json").read_text())
    return f"{doc.get('verb', 'diagnose')} {doc['schema_version']}"


def first_difference(rendered: bytes, golden: bytes) -> str:
    """Where ``rendered`` first departs from ``golden``: the line, and both around the column
    (a line of the HTML holds a whole base64 image)."""
    ours, theirs = rendered.splitlines(), golden.splitlines()
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            col = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            col = min(len(a), len(b)) if col is None else col
            start = max(0, col - SHOWN)
            return (
                f"line {i + 1}, column {col + 1}:\n"
                f"  rendered: {a[start : col + SHOWN]!r}\n"
                f"  golden:   {b[start : col + SHOWN]!r}"
            )
    return f"the same first lines, then rendered has {len(ours)} lines, golden {len(theirs)}"


def test_the_golden_runs_cover_every_verb_comparison_and_leaderboard() -> None:
    """A verb without a golden run (or a kind of folder that `vitreg report` renders) fails."""
    kinds = {kind(GOLDEN / name) for name in RUNS}
    wanted = {f"{verb} {SCHEMA_VERSION}" for verb in VERBS}
    wanted |= {"comparison: diagnose --models", "comparison: compare", "leaderboard"}
    wanted |= {"diagnose 1.1", "fix 1.1"}  # runs written before schema 2.0, read as 2.0
    assert wanted <= kinds, sorted(wanted - kinds)


@pytest.fixture
def golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the golden runs, the working directory: `compare` names its runs by the
    relative paths it was given (``diagnose``, ``diagnose_models``...), read from there."""
    copy = tmp_path / "golden"
    shutil.copytree(GOLDEN, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.chdir(copy)
    return copy


@pytest.mark.parametrize("name", RUNS)
def test_report_renders_the_golden_run_again_byte_for_byte(golden: Path, name: str) -> None:
    stored = GOLDEN / name
    pages = [p for p in PAGES if (stored / p).is_file()]
    assert pages, f"{stored} holds no page to compare"
    for page in pages:  # rendered from the saved results alone
        (golden / name / page).unlink()
    result = runner.invoke(app, ["report", name])
    assert result.exit_code == 0, result.output
    assert [p for p in PAGES if (golden / name / p).is_file()] == pages
    for path in sorted(stored.rglob("*")):
        if path.is_file():
            rel = path.relative_to(GOLDEN)
            rendered, want = (golden / rel).read_bytes(), path.read_bytes()
            assert rendered == want, f"{rel} differs: {first_difference(rendered, want)}"
