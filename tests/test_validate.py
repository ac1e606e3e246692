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


@pytest.mark.parametrize("verb", ["diagnose", "neurons", "fix"])
def test_config_rerun_reproduces_the_headlines(runs, verb, tmp_path):
    again = tmp_path / "again"
    args = [verb, "--config", str(runs[verb] / "config.yaml"), "--out", str(again)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output

    def headlines(run: Path) -> list:
        return [
            (m["name"], m["value"])
            for m in json.loads((run / "metrics.json").read_text())["metrics"]
        ]

    assert headlines(again) == headlines(runs[verb])
    first, second = (yaml_of(p) for p in (runs[verb], again))
    assert {**first, "out": None} == {**second, "out": None}


def yaml_of(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())


def test_bad_configs_name_the_file_and_the_field(runs, tmp_path):
    import yaml

    config = yaml_of(runs["neurons"])
    cases = [
        ({**config, "verb": "fix"}, "config of a fix run"),
        ({**config, "top_kk": 3}, "top_kk: Extra inputs are not permitted"),
        ({**config, "batch_size": -1}, "batch_size: Input should be greater than 0"),
        ({**config, "threshold": -5.0}, "threshold"),
        (["not", "a", "mapping"], "not a mapping"),
    ]
    for content, needle in cases:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(content))
        result = runner.invoke(app, ["neurons", "--config", str(path)])
        assert result.exit_code == 2, content
        err = " ".join(result.stderr.split())
        assert needle in err and str(path) in err and "Traceback" not in result.output, err
