"""``--checkpoint-every N``: a diagnose run killed mid-way resumes, on the same command, to the
metrics of an uninterrupted run; its checkpoints sit beside the run and go once it is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.models.model import Model

ARGS = ["diagnose", "planted:dinov2_s14", "--img-size", "56", "--limit", "12", "--batch-size", "4"]


def results(run_dir: Path) -> Any:
    doc = json.loads((run_dir / "metrics.json").read_text())
    return doc["results"], doc["data"]["n_images"]


@pytest.mark.slow
def test_a_killed_diagnose_command_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    plain = runner.invoke(app, [*ARGS, "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    out = tmp_path / "run"
    args = [*ARGS, "--out", str(out), "--checkpoint-every", "4"]
    calls = {"n": 0}
    features = Model.features

    def dying(self: Model, *a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # the third batch: two are saved
            raise RuntimeError("killed")
        return features(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Model, "features", dying)
        killed = runner.invoke(app, args)
    assert killed.exit_code != 0 and not (out / "metrics.json").exists()
    saved = sorted(p.name for p in (tmp_path / "run.resume").glob("pass-*.json"))
    assert saved == ["pass-0.rank0.4.json", "pass-0.rank0.8.json"]
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert results(out) == results(tmp_path / "plain")
    assert not (tmp_path / "run.resume").exists()
