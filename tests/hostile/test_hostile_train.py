"""Hostile training runs: a device that cannot run, a resume on other data or another number of
steps, a finished run trained again, a checkpoint whose step was edited by hand, a sidecar whose
fields have the wrong type -- each a named error (exit 2, no traceback) or a well-defined
result, never a silent jump."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import vitreg
from _support.cli_helpers import assert_clean_failure
from _support.train_helpers import run
from vitreg.cli.app import app as vitreg_app
from vitreg.errors import InputError, WeightsError

app = vitreg_app
runner = CliRunner()
MODEL = ["--model-arg", "depth=1", "--model-arg", "embed_dim=64", "--model-arg", "num_heads=2",
         "--model-arg", "patch_size=8", "--img-size", "32", "--batch-size", "4"]  # fmt: skip

pytestmark = pytest.mark.usefixtures("one_thread")


def train(out, *args: str):
    return runner.invoke(app, ["train", "vit_tiny_patch16_224", *MODEL, "--out", str(out), *args])


@pytest.mark.parametrize(
    ("device", "needle"),
    [("meta", "meta tensors hold no data"), ("cuda:99", "CUDA"), ("cuda:x", "not a torch device")],
)
def test_unusable_device_is_refused_before_training(tmp_path, device, needle) -> None:
    result = train(
        tmp_path, "--data", "synthetic-cls:n=8,size=32", "--steps", "1", "--device", device
    )
    assert_clean_failure(result, "--device", needle)
    assert not (tmp_path / "log.jsonl").exists()
    with pytest.raises(InputError, match="--device 'meta'"):
        run("supervised", tmp_path / "lib", device="meta")
    with pytest.raises(InputError, match="--device 'meta'"):
        vitreg.load("timm:vit_tiny_patch16_224", pretrained=False, device="meta")


def test_other_verbs_refuse_an_unusable_device_before_loading(tmp_path) -> None:
    for verb in (["diagnose"], ["neurons"], ["fix"], ["probe"]):
        result = runner.invoke(
            vitreg_app, [*verb, "--device", "meta", "--out", str(tmp_path / verb[0])]
        )
        assert_clean_failure(result, "--device", "meta tensors hold no data")
    inspect = runner.invoke(vitreg_app, ["inspect", "planted:dinov2_s14", "--device", "meta"])
    assert_clean_failure(inspect, "--device", "meta tensors hold no data")


def test_moving_a_loaded_model_refuses_an_unusable_device() -> None:
    from vitreg.verbs.loading import move

    model = vitreg.load("timm:vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32)
    with pytest.raises(InputError, match="--device 'meta': meta tensors hold no data"):
        move(model, "meta")
    assert move(model, "cpu") is model


def test_resume_checks_data_and_total_steps_and_extend_continues(tmp_path) -> None:
    data = ["--data", "synthetic-cls:n=8,size=32"]
    first = train(tmp_path, *data, "--steps", "2")
    assert first.exit_code == 0, first.output
    checkpoint = json.loads((tmp_path / "checkpoints" / "step-00000002.json").read_text())
    assert checkpoint["config"]["data"]["spec"] == "synthetic-cls:n=8,size=32"

    other_data = train(tmp_path, "--data", "synthetic-cls:n=12,size=32", "--steps", "2")
    assert_clean_failure(
        other_data, "data: checkpoint", "synthetic-cls:n=8,size=32", "synthetic-cls:n=12,size=32"
    )
    more_steps = train(tmp_path, *data, "--steps", "4")
    assert_clean_failure(more_steps, "steps: checkpoint 2, now 4", "--extend")
    fewer = train(tmp_path, *data, "--steps", "1")
    assert_clean_failure(fewer, "steps: checkpoint 2, now 1")

    # a finished run trained again resumes at its end: nothing trained, the last step recorded
    again = train(tmp_path, *data, "--steps", "2")
    assert again.exit_code == 0, again.output
    last = json.loads((tmp_path / "train.json").read_text())["last"]
    assert last is not None and last["step"] == 2

    extended = train(tmp_path, *data, "--steps", "4", "--extend")
    assert extended.exit_code == 0, extended.output
    steps = [json.loads(line)["step"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert json.loads((tmp_path / "train.json").read_text())["config"]["steps"] == 4


def test_checkpoint_with_an_edited_step_is_refused(tmp_path) -> None:
    run("supervised", tmp_path, steps=2, checkpoint_every=2)
    sidecar = tmp_path / "checkpoints" / "step-00000002.json"
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "step": 1000}))
    with pytest.raises(WeightsError, match="does not match its checksum") as err:
        run("supervised", tmp_path, steps=2, checkpoint_every=2)
    assert "step 1000" in str(err.value) and "saved at step 2" in str(err.value)
    # the same edit with the sidecar's checksum fixed up still disagrees with the tensor file
    from vitreg.train.checkpoint import _digest

    forged = {**meta, "step": 1000}
    sidecar.write_text(json.dumps({**forged, "meta_sha256": _digest(forged)}))
    with pytest.raises(WeightsError, match="saved at step 2"):
        run("supervised", tmp_path, steps=2, checkpoint_every=2)
    # any other edited field is caught by the sidecar's checksum
    sidecar.write_text(json.dumps({**meta, "world_size": 7}))
    with pytest.raises(WeightsError, match="fields were edited"):
        run("supervised", tmp_path, steps=2, checkpoint_every=2)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"step": [2]}, "step is [2], not an int"),
        ({"step": "2"}, "step is '2', not an int"),
        ({"tensors": "../../model.safetensors"}, "not a file name beside the sidecar"),
        ({"config": 5}, "config is 5, not a dict"),
        (None, "it holds [1, 2], not an object"),
    ],
)
def test_corrupt_checkpoint_sidecar_is_named(tmp_path, change, needle) -> None:
    data = ["--data", "synthetic-cls:n=8,size=32", "--steps", "2"]
    assert train(tmp_path, *data).exit_code == 0
    sidecar = tmp_path / "checkpoints" / "step-00000002.json"
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps([1, 2] if change is None else {**meta, **change}))
    # the command refuses first: the run's manifest no longer vouches for the edited file
    failed = train(tmp_path, *data)
    assert_clean_failure(failed, "step-00000002.json", "cannot prove it wrote")
    assert json.loads(sidecar.read_text()) == ([1, 2] if change is None else {**meta, **change})
    # the checkpoint reader itself names what is wrong with the sidecar
    (tmp_path / ".vitreg-manifest.json").unlink()
    with pytest.raises(WeightsError) as err:
        run("supervised", tmp_path, steps=2, checkpoint_every=2)
    assert "step-00000002.json" in str(err.value) and needle in str(err.value)
    assert "--no-resume" in str(err.value)


@pytest.mark.parametrize(
    ("arg", "needle"),
    [
        ("checkpoint_path=/etc/passwd", "checkpoint_path is refused"),
        ("pretrained=true", "pretrained is refused"),
        ("embed_dim=101", "dim should be divisible by num_heads"),
        ("embed_dim=32768", "billion parameters"),
        ("patch_size=64", "its patches are 64x64 pixels"),
    ],
)
def test_model_args_that_cannot_build_are_named_before_training(tmp_path, arg, needle) -> None:
    result = train(tmp_path, "--data", "synthetic-cls:n=8,size=32", "--steps", "1",
                   "--model-arg", arg)  # fmt: skip
    assert_clean_failure(result, needle)
    assert not (tmp_path / "checkpoints").exists()


def test_file_reading_model_args_are_refused_from_a_config_and_the_library(tmp_path) -> None:
    import yaml

    from vitreg.train.model import build_model

    config = tmp_path / "config.yaml"
    values = {"verb": "train", "variant": "vit_tiny_patch16_224", "data": "synthetic-cls:n=8",
              "steps": 1, "model_arg": ["pretrained_cfg_overlay={\"file\": \"/etc/passwd\"}"]}  # fmt: skip
    config.write_text(yaml.safe_dump(values))
    result = runner.invoke(app, ["train", "--config", str(config), "--out", str(tmp_path / "r")])
    assert_clean_failure(result, "pretrained_cfg_overlay is refused")
    with pytest.raises(InputError, match="checkpoint_path is refused"):
        build_model("vit_tiny_patch16_224", dynamic=False, img_size=32, num_classes=2,
                    kwargs={"checkpoint_path": "/etc/passwd"})  # fmt: skip
    assert not (tmp_path / "r").exists()
