"""The library verbs (``vitreg.run(Config(...))``) write what ``vitreg <verb>`` writes: the same
headline numbers and config.yaml on the same inputs, without printing; notices come back as data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import vitreg
from vitreg.cli.app import app
from vitreg.configs import (
    DiagnoseConfig,
    ExperimentConfig,
    FixConfig,
    NeuronsConfig,
    ProbeRunConfig,
    TrainRunConfig,
)
from vitreg.errors import InputError
from vitreg.results.probe import ProbeResults
from vitreg.verbs import DiagnoseRun, FixRun, NeuronsRun, Notice, ProbeRun, TrainRun

runner = CliRunner()
PLANTED = {"spec": "planted:dinov2_s14", "img_size": 112, "batch_size": 4}
RANDOM = {"spec": "timm:vit_tiny_patch16_224", "random_init": True, "img_size": 32}

pytestmark = pytest.mark.usefixtures("one_thread")


def flags(values: dict[str, Any]) -> list[str]:
    """The command-line form of config values (the spec as the argument)."""
    args = [str(values["spec"])] if "spec" in values else []
    for key, value in values.items():
        if key == "spec" or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def headline(run_dir: Path) -> list[tuple[str, Any]]:
    """The headline metrics of a run directory: (name, value), in document order."""
    doc = json.loads((run_dir / "metrics.json").read_text())
    return [(m["name"], m["value"]) for m in doc["metrics"]]


def settings(run_dir: Path) -> dict[str, Any]:
    """A run's config.yaml without its run directory."""
    return {
        k: v for k, v in yaml.safe_load((run_dir / "config.yaml").read_text()).items() if k != "out"
    }


def cli(verb: list[str], values: dict[str, Any], out: Path) -> None:
    result = runner.invoke(app, [*verb, *flags(values), "--out", str(out)])
    assert result.exit_code == 0, result.output


def same_as_cli(tmp: Path, verb: str, cls: type, values: dict[str, Any], capsys) -> Any:
    """Run ``values`` through the library and through the CLI; both run directories agree."""
    lib, command = tmp / f"{verb}-lib", tmp / f"{verb}-cli"
    capsys.readouterr()
    seen: list[Notice] = []
    run = vitreg.run(cls(**values, out=lib), on_notice=seen.append)
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == ""  # library code never prints
    assert seen == run.notices  # each notice also reached the listener, in order
    cli([verb], values, command)
    assert run.run_dir == lib and run.verb == verb
    assert headline(lib) == headline(command) and headline(lib)
    assert settings(lib) == settings(command)
    assert run.document == json.loads((lib / "metrics.json").read_text())
    return run


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("verbs")


def test_diagnose(tmp, cli_models, capsys):
    run = same_as_cli(
        tmp, "diagnose", DiagnoseConfig, {**PLANTED, "limit": 4, "max_maps": 1}, capsys
    )
    assert isinstance(run, DiagnoseRun) and [s for s, _ in run.labelled] == [PLANTED["spec"]]
    assert run.document["verb"] == "diagnose" and run.run_dirs == [run.run_dir]
    model, images = run.notices  # the planted model's own note, then the images it ran on
    assert model.kind == "model" and "synthetic" in model.text
    assert images.kind == "images" and images.text.startswith("images: up to 4") and images.caution


def test_neurons_then_fix(tmp, cli_models, capsys):
    run = same_as_cli(tmp, "neurons", NeuronsConfig, {**PLANTED, "limit": 8}, capsys)
    assert isinstance(run, NeuronsRun) and len(run.found.chosen) > 0
    assert (run.run_dir / "neurons.json").is_file()
    split = run.found.split
    assert f"split: {split['n_discovery']} images for discovery" in run.notices[-1].text
    neurons = str(run.run_dir / "neurons.json")
    fixed = same_as_cli(tmp, "fix", FixConfig, {**PLANTED, "limit": 4, "neurons": neurons}, capsys)
    assert isinstance(fixed, FixRun) and fixed.fix.neurons.pairs() == run.found.chosen.pairs()
    residual = fixed.comparison.results.residual
    assert fixed.document["results"]["comparison"]["residual"]["verdict"] == residual.verdict


def test_probe(tmp, cli_models, capsys):
    values = {**RANDOM, "data": "synthetic-cls:n=16,size=32", "epochs": 2, "seeds": 1}
    run = same_as_cli(tmp, "probe", ProbeRunConfig, {**values, "cache": tmp / "cache"}, capsys)
    assert isinstance(run, ProbeRun) and isinstance(run.probe, ProbeResults)
    assert run.probe.task == "classification"
    notice = next(n for n in run.notices if n.kind == "random_init")
    assert notice.text.startswith("RANDOM WEIGHTS: timm:vit_tiny_patch16_224") and notice.caution


def test_train(tmp, capsys):
    values = {"variant": "vit_tiny_patch16_224", "data": "synthetic-cls:n=8,size=32", "steps": 1}
    values |= {"batch_size": 4, "img_size": 32}
    lib, command = tmp / "train-lib", tmp / "train-cli"
    capsys.readouterr()
    run = vitreg.run(TrainRunConfig(**values, model_arg=["depth=1"], out=lib))
    assert capsys.readouterr().out == ""
    args = ["train", values["variant"], "--data", values["data"], "--steps", "1"]
    args += ["--batch-size", "4", "--img-size", "32", "--model-arg", "depth=1"]
    result = runner.invoke(app, [*args, "--out", str(command)])
    assert result.exit_code == 0, result.output
    assert isinstance(run, TrainRun) and run.training.steps == 1
    assert headline(lib) == headline(command) and settings(lib) == settings(command)


def test_experiment_calls_the_grid_as_the_command_does(tmp_path, monkeypatch, capsys):
    """The experiment itself is minutes of training; both paths hand run_variants the same
    settings, variants, config and command (up to the folder)."""
    import vitreg.experiment
    from vitreg.experiment import ExperimentResult
    from vitreg.results.experiment import ExperimentResults

    calls: list[dict] = []

    def fake(data, out, **kw):
        kw["config"] = {k: v for k, v in kw["config"].items() if k != "out"}
        kw["command"] = kw["command"].replace(str(out), "OUT")
        calls.append(
            {"data": data, **{k: v for k, v in kw.items() if k not in ("log", "progress")}}
        )
        kw["log"]("variant 1 of 1: training")
        nothing = ExperimentResults.model_construct(complete=True, variants=[])
        return ExperimentResult(Path(out), nothing, 0.0)

    monkeypatch.setattr(vitreg.experiment, "run_variants", fake)
    monkeypatch.setattr("torch.set_num_threads", lambda n: None)
    values = {"data": "synthetic:n=8,size=32", "size": "tiny", "steps": 1, "threads": 1}
    run = vitreg.run(ExperimentConfig(**values, include_gap=False, out=tmp_path / "lib"))
    args = ["experiment", "variants", "--data", values["data"], "--size", "tiny", "--steps", "1"]
    args += ["--threads", "1", "--no-gap", "--out", str(tmp_path / "cli")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(calls) == 2 and calls[0] == calls[1] and len(calls[0]["variants"]) == 9
    assert run.notices == [Notice("log", "variant 1 of 1: training")]  # data here, stderr there
    assert "variant 1 of 1: training" in result.stderr and "variant 1" not in result.stdout
    assert run.run_dir == tmp_path / "lib" and run.document is None  # the fake wrote nothing


def test_run_refuses_what_is_not_a_run_config():
    with pytest.raises(InputError, match="typed run config"):
        vitreg.run({"spec": "planted:dinov2_s14"})  # type: ignore[arg-type]


def test_demo_notice_is_data(tmp_path, monkeypatch):
    """With no spec the verb runs the demo and says so in its notices (the CLI prints them)."""
    from vitreg.verbs import diagnose as verb

    monkeypatch.setattr(verb, "diagnose_one", lambda *a, **k: (None, None))  # not the run
    run = vitreg.run(DiagnoseConfig(out=tmp_path / "demo"))
    assert run.notices[0].kind == "demo" and "planted:dinov2_s14" in run.notices[0].text
    assert run.labelled == [("planted:dinov2_s14", None)] and run.document is None


def test_models_of_mixed_kinds_run_on_the_same_images() -> None:
    from vitreg.verbs.diagnose import same_images
    from vitreg.verbs.result import Notices

    mixed = DiagnoseConfig(models="planted:dinov2_s14,timm:vit_tiny_patch16_224")
    notices = Notices(None)
    assert same_images(mixed, ["planted:dinov2_s14", "timm:vit_tiny_patch16_224"], notices).samples
    assert "same images" in notices.items[0].text
    planted = DiagnoseConfig(models="planted:dinov2_s14,planted:deit3_s16")
    assert not same_images(
        planted, ["planted:dinov2_s14", "planted:deit3_s16"], Notices(None)
    ).samples
    folder = DiagnoseConfig(models="planted:a,timm:b", images=Path("imgs"))
    assert same_images(folder, ["planted:a", "timm:b"], Notices(None)) is folder
