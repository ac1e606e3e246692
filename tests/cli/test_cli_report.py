"""A rendering failure is a bug that loses nothing: the command exits 1 with one paragraph (no
traceback) saying where the results are saved and that `vitreg report RUN` renders the report
again, and `vitreg report` does so once the renderer works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.report import compare
from vitreg.report.renderers import diagnose as diagnose_report
from vitreg.results.schema import validate_metrics

runner = CliRunner()
DIAGNOSE = ["diagnose", "planted:dinov2_s14", "--img-size", "56", "--limit", "2"]
DIAGNOSE += ["--batch-size", "2", "--max-maps", "1"]

pytestmark = pytest.mark.usefixtures("one_thread")


def broken(*args: object, **kwargs: object) -> None:
    raise RuntimeError("renderer broke")


def says(result, text: str) -> bool:
    """Whether stderr holds ``text``, whitespace aside (rich wraps the paragraph, and folds a
    long path, to the terminal width)."""
    return "".join(text.split()) in "".join(result.stderr.split())


def assert_render_failure(result, saved: Path, folder: Path) -> None:
    assert result.exit_code == 1, result.output
    assert says(result, "this is a bug in vitreg") and says(result, "RuntimeError: renderer broke")
    assert says(result, f"The results are saved in {saved};")
    assert says(result, f"`vitreg report {folder}` renders the report again")
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A diagnose run whose report rendering raised (the redundancy section)."""
    out = tmp_path_factory.mktemp("failed") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(diagnose_report, "_redundancy", broken)
        result = runner.invoke(app, [*DIAGNOSE, "--out", str(out)])
    return out, result


def test_rendering_failure_exits_1_with_the_results_saved(failed_run) -> None:
    out, result = failed_run
    assert_render_failure(result, out / "metrics.json", out)
    doc = validate_metrics(json.loads((out / "metrics.json").read_text()))
    assert doc.verb == "diagnose" and doc.results.norms.layers
    assert (out / "config.yaml").is_file() and (out / "figures" / "norm_maps.png").is_file()
    assert not (out / "report.md").exists() and not (out / "report.html").exists()
    checked = runner.invoke(app, ["validate", str(out)])
    assert checked.exit_code == 2 and "lacks report.md, report.html" in " ".join(
        checked.output.split()
    )


def test_vitreg_report_renders_the_saved_results_again(failed_run) -> None:
    out, _ = failed_run
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert f"written: {out / 'report.md'}" in " ".join(result.output.split())
    md = (out / "report.md").read_text()
    assert md.startswith("**SYNTHETIC MODEL:**") and "## Where outliers sit" in md
    assert "![norm_maps](figures/norm_maps.png)" in md  # the saved figures, with captions
    assert "L2 norm of each patch token" in md
    assert "data:image/webp;base64" in (out / "report.html").read_text()
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0


def test_a_comparison_renders_again_too(failed_run, tmp_path: Path, monkeypatch) -> None:
    out, _ = failed_run
    folder = tmp_path / "cmp"
    monkeypatch.setattr(compare, "wide_table", broken)
    result = runner.invoke(app, ["compare", str(out), "--out", str(folder)])
    assert_render_failure(result, folder / "comparison.json", folder)
    assert json.loads((folder / "comparison.json").read_text())["runs"] == ["run"]
    monkeypatch.undo()
    assert runner.invoke(app, ["report", str(folder)]).exit_code == 0
    assert "`artifacts_present`" in (folder / "comparison.md").read_text()
    assert (folder / "figures" / "model_curves.png").is_file()


def test_report_refuses_a_folder_without_results(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert says(result, "holds no metrics.json (nor comparison.json, leaderboard.json)")
    assert "Traceback" not in result.output
