"""A weights file's position-embedding grid decides the input size when none is given, and a
resampled position embedding is announced with both grids, never passed off as loaded as saved."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors.torch import save_file

import vitreg
from conftest import images
from vitreg.errors import WeightsError

ARCH = "timm:vit_small_patch14_dinov2"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 2-block DINOv2-S/14 made at 56 px (a 4x4 grid), its file and its features."""
    torch.manual_seed(0)
    model = vitreg.load(ARCH, pretrained=False, depth=2, img_size=56)
    path = tmp_path_factory.mktemp("w") / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.module.state_dict().items()}, str(path))
    x = images(2, 56)
    return path, x, model.features(x)


def quiet_load(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return vitreg.load(*args, **kwargs)


def test_without_img_size_the_file_decides_the_size(saved):
    path, x, ref = saved
    with pytest.warns(UserWarning, match="56x56 px taken from the weights file"):
        model = vitreg.load(ARCH, weights=path, depth=2)
    assert model.layout.grid == (4, 4) and model.describe().image_size == [56, 56]
    assert torch.allclose(model.features(x), ref, atol=1e-6)  # loaded as saved
    notes = " ".join(model.notes)
    assert "4x4 grid of 14 px patches" in notes and "--img-size" in notes
    assert "takes 518x518 inputs by default" not in notes  # no stale advice to pass img_size
    assert "resampled from" not in notes


def test_another_img_size_resamples_and_says_so_with_both_grids(saved):
    path, _, _ = saved
    with pytest.warns(UserWarning, match="position embedding resampled from 4x4 to 8x8"):
        model = vitreg.load(ARCH, weights=path, depth=2, img_size=112)
    assert model.layout.grid == (8, 8)
    assert not any("taken from the weights file" in n for n in model.notes)
    assert model.features(images(1, 112)).shape[1] == 1 + 64


def test_a_local_folder_without_img_size_takes_the_file_size(saved, tmp_path):
    path, x, ref = saved
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(path.read_bytes())
    config = {"architecture": "vit_small_patch14_dinov2", "model_args": {"depth": 2}}
    (folder / "config.json").write_text(json.dumps(config))
    model = quiet_load(f"local:{folder}")
    assert model.layout.grid == (4, 4)
    assert torch.allclose(model.features(x), ref, atol=1e-6)
    assert any("taken from the weights file" in n for n in model.notes)
    config["model_args"]["img_size"] = 112  # the folder's size contradicts its weights: refused
    (folder / "config.json").write_text(json.dumps(config))
    shapes = r"pos_embed: file \(1, 17, 384\) \(a 4x4 grid\), model \(1, 65, 384\) \(a 8x8 grid\)"
    with pytest.raises(WeightsError, match=shapes + ".*img_size to 56"):
        quiet_load(f"local:{folder}")
    model = quiet_load(f"local:{folder}", img_size=112)  # the caller's size: resampled, said
    assert model.layout.grid == (8, 8)
    assert any("resampled from 4x4 to 8x8" in n for n in model.notes)


def test_a_grid_too_large_to_build_names_img_size(tmp_path):
    state = {"pos_embed": torch.zeros(1, 1 + 300 * 300, 8)}
    path = tmp_path / "big.safetensors"
    save_file(state, str(path))
    with pytest.raises(WeightsError, match="300x300 grid.*--img-size"):
        vitreg.load(ARCH, weights=path, depth=1)
