"""One result document for every verb: each verb's smallest run validates against the schema
(`vitreg validate`), and a broken document is refused with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.verbs.validate import check_run

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
    assert check_run(runs[verb]).startswith(f"{verb} run, schema 2.0,")
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


@pytest.mark.parametrize("verb", ["diagnose", "neurons", "fix", "probe", "train"])
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
        folded = "".join(result.stderr.split())  # a long path may be folded across lines
        assert needle in err and str(path) in folded and "Traceback" not in result.output, err


def write_yaml(path: Path, content: object) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(content))
    return path


EXPERIMENT = {"verb": "experiment", "data": "synthetic:n=8,size=32", "size": "tiny", "steps": 1}
BAD = {
    "probe": [
        ({"seedz": 2}, "seedz: Extra inputs are not permitted"),
        ({"epochs": "many"}, "epochs: Input should be a valid integer"),
        ({"seeds": 0}, "seeds: Input should be greater than 0"),
        ({"task": "colour"}, "task: not a probe task; choose from attention-seg, classification"),
        ({"optimizer": "adam"}, "optimizer: Input should be 'adamw' or 'sgd'"),
        ({"fix": "nowhere.json"}, "fix: neither none, both, builtin nor an existing NeuronSet"),
        ({"neurons": "builtin"}, "neurons: applies to fix both only"),
        ({"layers": ","}, "layers: names no layer"),
    ],
    "train": [
        ({"stepz": 1}, "stepz: Extra inputs are not permitted"),
        ({"lr": "fast"}, "lr: Input should be a valid number"),
        ({"lr": -1.0}, "lr: Input should be greater than 0"),
        ({"epochs": float("inf")}, "epochs: epochs must be a finite number"),
        ({"accum_steps": 0}, "accum_steps: Input should be greater than 0"),
        ({"recipe": "mae"}, "recipe: Input should be 'supervised' or 'dino'"),
        ({"amp": "fp8"}, "amp: Input should be 'auto', 'off', 'bf16' or 'fp16'"),
        ({"model_arg": ["depth"]}, "model_arg: 'depth' is not KEY=VALUE"),
        ({"data": None}, "data: Input should be a valid string"),
        ({"steps": None, "epochs": None}, "pass steps or epochs"),
    ],
    "experiment": [
        ({"sizes": "tiny"}, "sizes: Extra inputs are not permitted"),
        ({"steps": "few"}, "steps: Input should be a valid integer"),
        ({"threads": 0}, "threads: Input should be greater than 0"),
        ({"size": "huge"}, "size: unknown size preset; choose one of tiny, small"),
        ({"recipe": "mae"}, "recipe: Input should be 'supervised' or 'dino'"),
        ({"pretrained": True}, "pretrained applies to finetune NAME"),
    ],
}


@pytest.mark.parametrize("verb", ["probe", "train", "experiment"])
def test_bad_configs_of_probe_train_and_experiment_name_the_file_and_the_field(
    runs, verb, tmp_path
):
    config = EXPERIMENT if verb == "experiment" else yaml_of(runs[verb])
    command = ["experiment", "variants"] if verb == "experiment" else [verb]
    for change, needle in BAD[verb]:
        path = write_yaml(tmp_path / "config.yaml", {**config, **change})
        result = runner.invoke(app, [*command, "--config", str(path)])
        assert result.exit_code == 2, (change, result.output)
        err = " ".join(result.stderr.split())
        folded = "".join(result.stderr.split())  # a long path may be folded across lines
        assert needle in err and str(path) in folded and "Traceback" not in result.output, err
    path = write_yaml(tmp_path / "config.yaml", {**config, "verb": "neurons"})
    result = runner.invoke(app, [*command, "--config", str(path)])
    assert result.exit_code == 2 and "config of a neurons run" in " ".join(result.stderr.split())


def test_probe_library_call_gives_the_cli_numbers(runs, tmp_path):
    """``vitreg.probe.run.run`` on the typed config's values scores what `vitreg probe` did."""
    import torch

    import vitreg
    from vitreg.configs import ProbeRunConfig, load_config
    from vitreg.probe.linear import FitSettings
    from vitreg.probe.run import run
    from vitreg.results.schema import plain, resolve

    cfg = load_config(runs["probe"] / "config.yaml", "probe")
    assert isinstance(cfg, ProbeRunConfig) and cfg.fix == "none" and cfg.random_init
    torch.manual_seed(0)  # the CLI builds random-init weights from seed 0
    model = vitreg.load(cfg.spec, pretrained=False, img_size=cfg.img_size)
    result = run(
        model,
        cfg.task,
        cfg.data,
        layers=[int(x) for x in cfg.layers.split(",")],
        cache_dir=tmp_path / "cache",  # a fresh cache: features computed again
        config=FitSettings(
            seeds=tuple(range(cfg.seeds)), epochs=cfg.epochs, optimizer=cfg.optimizer
        ),
        batch_size=cfg.batch_size,
        image_size=cfg.img_size,
    )
    doc = {"results": json.loads(json.dumps(plain(result.results)))}
    metrics = json.loads((runs["probe"] / "metrics.json").read_text())["metrics"]
    assert metrics
    for m in metrics:
        assert resolve(doc, m["source"]) == pytest.approx(m["value"], abs=1e-6), m["name"]


def test_train_library_call_gives_the_cli_numbers(runs, tmp_path):
    """``vitreg.train.train`` on the typed config's values trains what `vitreg train` did."""
    from vitreg.configs import load_config
    from vitreg.train import TrainSettings, train

    cfg = load_config(runs["train"] / "config.yaml", "train")
    assert cfg.model_arg == ["depth=1"] and cfg.option is None
    settings = TrainSettings(**cfg.model_dump(include=set(TrainSettings.model_fields)))
    result = train(cfg.variant, cfg.data, settings, tmp_path / "lib", model_kwargs={"depth": 1})
    doc = json.loads((runs["train"] / "metrics.json").read_text())["results"]
    assert result.steps == doc["steps"] == 1
    assert result.losses[-1] == doc["final_loss"]


def test_experiment_config_round_trips_and_reruns_the_same_call(tmp_path, monkeypatch):
    """The experiment's config.yaml loads as its typed config, and ``--config`` calls
    ``run_variants`` exactly as the options did (the experiment itself is not run here)."""
    import torch

    import vitreg.experiment
    from vitreg.configs import ExperimentConfig, load_config
    from vitreg.experiment import ExperimentResult
    from vitreg.results.experiment import ExperimentResults

    cfg = ExperimentConfig(data="synthetic:n=8,size=32", out=tmp_path / "exp", steps=1)
    path = write_yaml(tmp_path / "config.yaml", cfg.to_file())
    assert load_config(path, "experiment") == cfg

    calls: list[dict] = []

    def fake(data, out, **kw):
        calls.append({"data": data, "out": out, **{k: v for k, v in kw.items() if k != "log"}})
        write_yaml(tmp_path / f"config-{len(calls)}.yaml", kw["config"])
        done = ExperimentResults.model_construct(complete=True, variants=[])
        return ExperimentResult(Path(out), done, 0.0)

    monkeypatch.setattr(vitreg.experiment, "run_variants", fake)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append({"threads": n}))
    args = ["experiment", "variants", "--data", "synthetic:n=8,size=32", "--size", "tiny"]
    args += ["--steps", "1", "--no-gap", "--threads", "2", "--out", str(tmp_path / "exp")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    first = tmp_path / "config-2.yaml"
    written = load_config(first, "experiment")
    assert written.size == "tiny" and written.include_gap is False and written.threads == 2
    result = runner.invoke(app, ["experiment", "variants", "--config", str(first)])
    assert result.exit_code == 0, result.output
    assert calls[:2] == calls[2:]  # same threads, settings, variants, command and config
    assert calls[1]["settings"].steps == 1 and len(calls[1]["variants"]) == 9
    result = runner.invoke(app, ["experiment", "variants", "--config", str(first), "--steps", "3"])
    assert result.exit_code == 0 and calls[-1]["settings"].steps == 3  # the option wins


def test_train_and_experiment_configs_allow_what_the_trainer_does():
    from typing import get_args

    from vitreg.configs import ExperimentConfig, TrainRunConfig
    from vitreg.core.choices import AMP, RECIPES
    from vitreg.settings.train import TrainSettings
    from vitreg.train.config import DEFAULTS

    assert issubclass(TrainRunConfig, TrainSettings)  # the CLI's settings are train()'s
    fields = TrainRunConfig.model_fields
    assert get_args(fields["recipe"].annotation) == RECIPES == tuple(DEFAULTS)
    assert get_args(fields["amp"].annotation) == AMP
    assert set(get_args(ExperimentConfig.model_fields["recipe"].annotation)) == set(RECIPES)
