"""probe.run and its run directory: base and fixed side by side, cache reuse, traceable
metrics.json, and bad input (VOC / NYU layouts) counted and reported end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import vitreg
from _support.saved_config import SavedConfig
from vitreg.errors import InputError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.probe.features import CachedFeatures
from vitreg.probe.linear import FitSettings
from vitreg.probe.run import run
from vitreg.report.renderers.probe import task_and_data, write_probe_run
from vitreg.results.schema import model_info, resolve

CFG = FitSettings(seeds=(0, 1), epochs=3)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> vitreg.Model:
    """A seeded 2-block DINOv2-reg4 ViT-S at 28 px (1 cls + 4 registers + 2 x 2 patches)."""
    torch.manual_seed(0)
    return vitreg.load("timm:vit_small_patch14_reg4_dinov2", pretrained=False, img_size=28, depth=2)


def tiny_vit() -> vitreg.Model:
    torch.manual_seed(0)
    module = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1
    )
    return vitreg.wrap(module.eval())


def write_run(result, out: Path) -> dict:
    config = {"command": "probe", "task": result.results.task}
    write_probe_run(
        out, result.results, model_info(result.model), SavedConfig(config), "vitreg probe (test)"
    )
    return json.loads((out / "metrics.json").read_text())


# ------------------------------------------------------------------ base + fixed, reuse, report
def test_run_with_fix_reuses_the_cache_and_writes_a_traceable_report(model, tmp_path: Path) -> None:
    fix = TestTimeRegisters(NeuronSet([0], [5], [1.0]))
    data, cache = "synthetic-cls:n=16,size=28", tmp_path / "cache"
    first = run(model, "classification", data, fix=fix, layers=(0, -1), cache_dir=cache, config=CFG)
    assert set(first.results.conditions) == {"base", "fixed"}
    assert set(first.results.caches) == {"base/train", "base/test", "fixed/train", "fixed/test"}
    assert all(c.forward_passes > 0 for c in first.results.caches.values())
    assert first.results.layers == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    fixed_features = {s.feature for s in first.results.conditions["fixed"][0].scores}
    assert "test_time_registers" in fixed_features
    assert "test_time_registers" not in {
        s.feature for s in first.results.conditions["base"][0].scores
    }
    assert first.results.fix.name == "TestTimeRegisters"

    again = run(model, "classification", data, fix=fix, layers=(0, -1), cache_dir=cache, config=CFG)
    assert {s: c.forward_passes for s, c in again.results.caches.items()} == dict.fromkeys(
        first.results.caches, 0
    )
    same = [r.results.model_dump(mode="json")["conditions"] for r in (again, first)]
    assert same[0] == same[1]  # seeded: same scores

    doc = write_run(again, tmp_path / "run")
    assert len(doc["metrics"]) == sum(
        len(layer["scores"]) for layers in doc["results"]["conditions"].values() for layer in layers
    )
    for m in doc["metrics"]:
        value = resolve(doc, m["source"])
        assert value == m["value"], m
        prefix = f"{task_and_data(doc['results'])}/"  # the task and data come first
        assert m["name"].startswith(prefix) and prefix.startswith("classification/"), m
        condition, layer = m["name"].removeprefix(prefix).split("/")[:2]
        assert condition in ("base", "fixed") and layer in again.results.layers
        assert m["source"].startswith(f"/results/conditions/{condition}/")
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| feature | tokens | metric | base | fixed | Δ (fixed − base) |" in report
    assert "Features reused from the cache (no forward pass): base/train" in report
    assert (tmp_path / "run" / "report.html").is_file() and (
        tmp_path / "run" / "config.yaml"
    ).is_file()


# ------------------------------------------------------------------ bad input, end to end
def rgb(path: Path, w: int = 40, h: int = 32, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)


def palette_png(path: Path, ids: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(ids.astype(np.uint8))
    img.putpalette([v for i in range(256) for v in (i, 255 - i, i // 2)])
    img.save(path)


def voc_tree(root: Path) -> Path:
    """VOC2012 layout: 7 train images (one with a 10x10 mask: mismatched), 2 val images; every
    mask of size 32x40 holds 3 pixels of the unknown class id 30."""
    voc = root / "VOC2012"
    for i, key in enumerate("abcdefghi"):
        rgb(voc / "JPEGImages" / f"{key}.jpg", seed=i)
        ids = np.zeros((32, 40), np.uint8)
        ids[:, 20:] = 1 + i % 3
        ids[4, 18:21] = 30
        palette_png(voc / "SegmentationClass" / f"{key}.png", ids if key != "b" else ids[:10, :10])
    sets = voc / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    (sets / "train.txt").write_text("\n".join("abcdefg") + "\n")
    (sets / "val.txt").write_text("h\ni\n")
    return root


def test_voc_mismatch_and_unknown_ids_reach_metrics_json_and_report(tmp_path: Path) -> None:
    data = f"voc:{voc_tree(tmp_path / 'voc')}"
    result = run(tiny_vit(), "segmentation", data, layers=(0,), cache_dir=tmp_path / "cache",
                 config=CFG)  # fmt: skip
    assert result.results.caches["base/train"].n == 6 and result.results.caches["base/test"].n == 2
    doc = write_run(result, tmp_path / "run")
    skipped = doc["data"]["skipped"]
    assert skipped["base/train: mask_size_mismatch"] == "1 samples skipped"
    assert skipped["base/train: unknown_class_pixels"] == "18 pixels set to ignore/invalid"
    assert skipped["base/test: unknown_class_pixels"] == "6 pixels set to ignore/invalid"
    assert doc["data"]["n_images"] == 8
    assert doc["data"]["train"]["log"] == {"mask_size_mismatch": 1, "unknown_class_pixels": 18}
    assert doc["data"]["test"]["log"] == {"unknown_class_pixels": 6}
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| base/train: mask_size_mismatch | 1 samples skipped |" in report
    assert "| base/train: unknown_class_pixels | 18 pixels set to ignore/invalid |" in report
    assert (
        result.results.conditions["base"][0].info.ignored_test_pixels == 6
    )  # still ignored at input size
    miou = result.results.conditions["base"][0].scores[0].values
    assert all(0 <= v <= 1 for v in miou)


def nyu_tree(root: Path) -> Path:
    """NYU layout, depth as png (mm) or npy (m); every map has 32 x 5 zeros and 4 NaN pixels
    (stored as 0 mm in the png maps): 164 invalid pixels each."""
    for split, keys in (("train", "abcdef"), ("val", "ef")):
        (root / split / "depth").mkdir(parents=True)
        for i, key in enumerate(keys):
            rgb(root / split / "rgb" / f"{key}.jpg", seed=10 + i)
            depth = np.full((32, 40), 2.0 + i, np.float32)
            depth[:, :5] = 0.0
            depth[0, 10:14] = np.nan
            if i % 2:
                np.save(root / split / "depth" / f"{key}.npy", depth)
            else:
                mm = np.nan_to_num(depth * 1000).astype(np.uint16)
                Image.fromarray(mm).save(root / split / "depth" / f"{key}.png")
    return root


def test_nyu_invalid_depth_is_counted_and_ignored(tmp_path: Path) -> None:
    data = f"nyu:{nyu_tree(tmp_path / 'nyu')}"
    result = run(tiny_vit(), "depth", data, layers=(0,), cache_dir=tmp_path / "cache", config=CFG)
    doc = write_run(result, tmp_path / "run")
    skipped = doc["data"]["skipped"]
    assert skipped["base/train: invalid_depth_pixels"] == "984 pixels set to ignore/invalid"
    assert skipped["base/test: invalid_depth_pixels"] == "328 pixels set to ignore/invalid"
    report = (tmp_path / "run" / "report.md").read_text()
    assert "base/test: invalid_depth_pixels" in report
    test = CachedFeatures(result.results.caches["base/test"].folder)
    depth = test.targets("depth")
    assert torch.isnan(depth).any() and result.results.conditions["base"][
        0
    ].info.invalid_test_pixels == int(torch.isnan(depth).sum())
    for score in result.results.conditions["base"][
        0
    ].scores:  # NaN pixels are left out, not propagated
        assert all(np.isfinite(v) for v in score.values), score


def test_a_handful_of_images_still_probes_and_one_image_says_why(tmp_path: Path) -> None:
    result = run(tiny_vit(), "segmentation", "synthetic-seg:n=3,size=32", layers=(0,),
                 cache_dir=tmp_path, config=CFG)  # fmt: skip
    assert result.results.caches["base/train"].n == 3
    assert all(0 <= v <= 1 for v in result.results.conditions["base"][0].scores[0].values)
    with pytest.raises(InputError, match="at least 2 training samples"):
        run(tiny_vit(), "segmentation", "synthetic-seg:n=1,size=32", layers=(0,),
            cache_dir=tmp_path, config=CFG)  # fmt: skip
