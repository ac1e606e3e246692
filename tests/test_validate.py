"""One result document for every verb: each verb's smallest run validates against the schema
(`vitreg validate`), and a broken document is refused with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.cli.validate_cmd import check_run

runner = CliRunner()
PLANTED = ["planted:dinov2_s14", "--img-size", "112", "--limit", "8", "--batch-size", "4"]
RANDOM = ["timm:vit_tiny_patch16_224", "--random-init", "--img-size", "32"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    out = {verb: root / verb for verb in ("diagnose", "neurons", "fix", "probe", "train")}
    commands = {
        "diagnose": ["diagnose", *PLANTED],
        "neurons": ["neurons", *PLANTED],
        "fix": ["fix", *PLANTED, "--neurons", str(out["neurons"] / "neurons.json")],
        "probe": [
            "probe",
            *RANDOM,
            "--task",
            "classification",
            "--data",
            "synthetic-cls:n=16,size=32",
            "--epochs",
            "2",
            "--cache",
            str(root / "cache"),
        ],
        "train": [
            "train",
            "vit_tiny_patch16_224",
            "--data",
            "synthetic-cls:n=8,size=32",
            "--steps",
            "1",
            "--batch-size",
            "4",
            "--img-size",
            "32",
            "--model-arg",
            "depth=1",
        ],
    }
    for verb, args in commands.items():
        result = runner.invoke(app, [*args, "--out", str(out[verb])])
        assert result.exit_code == 0, (verb, result.output)
    return out


@pytest.mark.parametrize("verb", ["diagnose", "neurons", "fix", "probe", "train"])
def test_every_verb_writes_a_valid_result_document(runs, verb):
    assert check_run(runs[verb]).startswith(f"{verb} run, schema 1.1")
    doc = json.loads((runs[verb] / "metrics.json").read_text())
    assert doc["verb"] == verb and doc["metrics"]


def test_validate_command_lists_each_run_and_fails_on_a_broken_one(runs, tmp_path):
    result = runner.invoke(app, ["validate", *(str(p) for p in runs.values())])
    assert result.exit_code == 0, result.output
    assert result.output.count("valid") == len(runs)
    broken = tmp_path / "broken"
    broken.mkdir()
    doc = json.loads((runs["neurons"] / "metrics.json").read_text())
    for name in ("config.yaml", "report.md", "report.html"):
        (broken / name).write_text("x")
    del doc["results"]["held_out"]
    (broken / "metrics.json").write_text(json.dumps(doc))
    result = runner.invoke(app, ["validate", str(broken)])
    assert result.exit_code == 2
    assert "results.held_out" in " ".join(result.output.split())
    doc = json.loads((runs["fix"] / "metrics.json").read_text())
    doc["metrics"][0]["value"] = 12345.0  # a headline that no longer traces to its source
    (broken / "metrics.json").write_text(json.dumps(doc))
    result = runner.invoke(app, ["validate", str(broken)])
    assert result.exit_code == 2 and "differs from" in " ".join(result.output.split())
    result = runner.invoke(app, ["validate", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "no metrics.json" in " ".join(result.output.split())
