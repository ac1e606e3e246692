"""``vitreg probe planted:pruning --task pruning``: the run directory holds the curves figure,
one score per arm and keep ratio, and re-renders to the same report."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


def test_probe_pruning_draws_the_curves(tmp_path) -> None:
    out = tmp_path / "run"
    args = ["probe", "planted:pruning", "--task", "pruning", "--data", "synthetic-cls:n=32,hue=1",
            "--epochs", "2", "--seeds", "1", "--batch-size", "16", "--cache", str(tmp_path / "c"),
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Pruning base, keep 10% of the patches: `" in result.output
    assert (out / "figures" / "probe_pruning_curves.png").is_file()
    report = (out / "report.md").read_text()
    assert "probe_pruning_curves.png" in report
    layer = json.loads((out / "metrics.json").read_text())["results"]["conditions"]["base"][0]
    assert layer["info"]["keep_ratios"] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert layer["info"]["kept_tokens"] == [6, 13, 19, 26, 32, 38, 45, 51, 58]
    arms = {(s["feature"], s["group"]) for s in layer["scores"]}
    assert len(arms) == 1 + 4 * 9 and ("sink-aware", "keep 10%") in arms
    assert "Means over seeds [0] with Student-t 95% confidence" in report
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    assert (out / "report.md").read_text() == report
