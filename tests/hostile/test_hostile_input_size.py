"""An input size the model cannot take -- not a whole number of patches, smaller than a patch,
too large for memory -- fails before any image runs with an error naming --img-size (never the
weights of a local: folder); the offline hint names the CLI's real options."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
from typer.testing import CliRunner

import vitreg
from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app
from vitreg.errors import InputError
from vitreg.models.load import offline_hint
from vitreg.models.loaders.local import save_local

runner = CliRunner()
ARCH = "vit_tiny_patch16_224"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize(
    ("size", "needle"),
    [
        ("7", "must be a whole number of patches; pass a multiple of 16"),
        ("40", "its patches are 16x16 pixels"),
        ("100000", "--img-size: the input size must be a whole number of pixels from 1 to 4096"),
        ("4096", "GiB of activations"),
    ],
)
def test_img_size_the_model_cannot_take_names_the_option(tmp_path: Path, size, needle) -> None:
    args = ["diagnose", f"timm:{ARCH}", "--random-init", "--img-size", size, "--out", str(tmp_path)]
    flat = assert_clean_failure(runner.invoke(app, args), "--img-size", size, needle)
    assert "weights" not in flat
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.parametrize("verb", ["diagnose", "neurons", "fix"])
@pytest.mark.parametrize(
    ("size", "needle"), [("7", "multiple of 14 (e.g. 28)"), ("14", "1x1 grid")]
)
def test_fewer_than_two_by_two_patches_is_refused_in_every_verb(tmp_path, verb, size, needle):
    args = [verb, "planted:dinov2_s14", "--img-size", size, "--out", str(tmp_path / "run")]
    flat = assert_clean_failure(runner.invoke(app, args), f"--img-size {size}", needle)
    assert "at least 2x2 patches" in flat or "whole number of patches" in flat
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "verb",
    [
        ["probe", f"timm:{ARCH}", "--random-init"],
        ["train", ARCH, "--data", "synthetic-cls:n=8", "--steps", "1"],
    ],
)
def test_img_size_too_large_is_refused_before_allocating(tmp_path, verb) -> None:
    args = [*verb, "--img-size", "100000", "--out", str(tmp_path / "run")]
    assert_clean_failure(runner.invoke(app, args), "--img-size", "100000", "from 1 to 4096")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ("size=100000", "16 <= size <= 4096"),
        ("n=100000000", "1 <= n <= 10,000,000"),
        ("seed=" + "9" * 5000, "seed must be an integer of at most 20 digits"),
    ],
)
@pytest.mark.parametrize(
    "verb",
    [["probe", f"timm:{ARCH}", "--random-init"], ["train", ARCH, "--steps", "1"]],
)
def test_synthetic_data_beyond_its_bounds_names_the_option(tmp_path, verb, data, needle) -> None:
    args = [*verb, "--data", f"synthetic-cls:{data}", "--out", str(tmp_path / "run")]
    assert len(assert_clean_failure(runner.invoke(app, args), "--data", needle)) < 400


def test_local_folder_with_another_img_size_blames_the_size_not_the_weights(tmp_path) -> None:
    torch.manual_seed(0)
    module = timm.create_model(ARCH, pretrained=False, depth=1, img_size=32).eval()
    folder = save_local(module, tmp_path / "m", depth=1, img_size=32)
    for size in ("8", "40"):
        args = ["diagnose", f"local:{folder}", "--img-size", size, "--out", str(tmp_path / size)]
        flat = assert_clean_failure(
            runner.invoke(app, args), f"--img-size {size}", "multiple of 16"
        )
        assert "do not fit" not in flat and "the weights in" not in flat
    with pytest.raises(InputError, match="img_size=40"):
        vitreg.load(f"local:{folder}", img_size=40)
    assert vitreg.load(f"local:{folder}", img_size=48).layout.grid == (3, 3)  # resampled


def test_offline_hint_names_the_cli_options() -> None:
    hint = offline_hint("hub id 'timm/x'", OSError("network unreachable"))
    for option in ("--random-init", "--weights FILE", "local:DIR", "HF_HUB_OFFLINE=1"):
        assert option in hint
    assert "pretrained=False" not in hint


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["fix", "--registers", "100000"],
            "--registers: Input should be less than or equal to 256",
        ),
        (["probe", "--seeds", "1000000000"], "--seeds: Input should be less than or equal to 1000"),
        (["diagnose", "--batch-size", "10000000"], "--batch-size: Input should be less than"),
        (["diagnose", "--max-maps", "100000"], "--max-maps: Input should be less than"),
    ],
)
def test_counts_that_size_a_run_are_bounded_before_it_starts(tmp_path, args, needle) -> None:
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert_clean_failure(result, needle)
    assert not (tmp_path / "run").exists()
