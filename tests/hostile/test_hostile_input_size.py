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
from cli_helpers import assert_clean_failure
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
        ("100000", "from 1 to 4096"),
        ("4096", "GiB of activations"),
    ],
)
def test_img_size_the_model_cannot_take_names_the_option(tmp_path: Path, size, needle) -> None:
    args = ["diagnose", f"timm:{ARCH}", "--random-init", "--img-size", size, "--out", str(tmp_path)]
    flat = assert_clean_failure(runner.invoke(app, args), f"--img-size {size}", needle)
    assert "weights" not in flat
    assert not (tmp_path / "metrics.json").exists()


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
