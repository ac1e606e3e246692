"""Open-vocabulary segmentation on a tiny random-init open_clip CLIP: crop offsets, the pixel
predictions against a hand computation of the protocol, the sliding window, the keep-ratio
resize on non-square images scored at the masks' size, the protocol's class lists, and a probe
run with and without a last-block fix."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import vitreg
from vitreg.data.datasets import Sample, open_dataset
from vitreg.data.formats import ADE20K_CLASSES, VOC_CLASSES
from vitreg.fix.naclip import NACLIP
from vitreg.probe.cache import input_config
from vitreg.probe.metrics import miou
from vitreg.probe.ov_seg_data import (
    CITYSCAPES_CLASSES,
    COCO_OBJECT_CLASSES,
    COCO_STUFF_CLASSES,
    CONTEXT60_CLASSES,
)
from vitreg.probe.run import run
from vitreg.probe.tasks.ov_seg import (
    BACKGROUND_NAMES,
    PROTOCOLS,
    OvSeg,
    confusion,
    miou_of,
    protocol_names,
    resized_size,
    windows,
)

open_clip = pytest.importorskip("open_clip")
TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
ARCH = "vitreg-tiny-ovseg-clip"
DATA = "synthetic-seg:n=4,size=32"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def clip_model(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("open_clip_cfg")
    (folder / f"{ARCH}.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(folder)
    torch.manual_seed(0)
    return vitreg.load(f"open_clip:{ARCH}", pretrained=False)


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two prompt templates (the 80 OpenAI ones only cost text-tower time here)."""
    path = tmp_path_factory.mktemp("templates") / "templates.txt"
    path.write_text("a photo of a {}.\na {} shape\n")
    return path


@pytest.fixture(scope="module")
def task(clip_model, templates) -> OvSeg:
    t = OvSeg()
    t.setup(clip_model, open_dataset(DATA, "val"), {"templates": templates})
    return t


def test_windows_cover_the_image_with_half_stride_and_a_flush_last_crop():
    assert windows(448, 224) == [0, 112, 224]
    assert windows(300, 224) == [0, 76]
    assert windows(200, 224) == [0]


def test_pixel_predictions_follow_the_protocol(clip_model, task) -> None:
    assert task.k == 4 and task.background and len(task.owner) == 3 + len(BACKGROUND_NAMES)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tokens = clip_model.module(x)  # open_clip returns the pooled embedding; read the tokens
        feats = clip_model.features(x)[:, 1:] @ clip_model.module.proj  # [CLS] first, 4x4 after
    assert tokens.shape == (2, 32)
    cos = F.normalize(feats, dim=-1) @ F.normalize(task.classes, dim=-1).T  # [B, 16, names]
    up = F.interpolate(cos.transpose(1, 2).reshape(2, -1, 4, 4), size=(32, 32), mode="bilinear")
    probs = torch.softmax(65.0 * up, dim=1)
    per_class = torch.stack([probs[:, task.owner == c].amax(1) for c in range(4)], dim=1)
    pred = per_class.argmax(1)
    for b in range(2):  # area rule: a foreground class under 10% of the foreground is dropped
        counts = torch.bincount(pred[b].flatten(), minlength=4)[1:].float()
        for c in range(1, 4):
            if counts[c - 1] <= 0.1 * counts.sum():
                per_class[b, c] = 0
    top, pred = per_class.max(1)
    pred[top < 0.1] = 0
    with torch.no_grad():
        got = task.outputs(clip_model, x)
    assert torch.equal(got.long(), pred)


def test_larger_images_are_read_in_half_overlapping_crops(clip_model, task) -> None:
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = task.logits(clip_model, x)
        corner = task.logits(clip_model, x[..., :32, :32])
        centre = task.logits(clip_model, x[..., 16:48, 16:48])
    torch.testing.assert_close(full[..., :16, :16], corner[..., :16, :16])  # one crop only
    assert not torch.allclose(full[..., 16:32, 16:32], corner[..., 16:32, 16:32])  # averaged
    assert full.shape[-2:] == (64, 64) and centre.shape[-2:] == (32, 32)


@pytest.mark.slow  # about 20 s on a shared CPU (two passes and the text tower)
def test_probe_run_scores_ov_seg_with_and_without_a_fix(clip_model, templates, tmp_path) -> None:
    result = run(clip_model, "ov-seg", DATA, fix=NACLIP(), cache_dir=tmp_path, batch_size=2,
                 templates=templates)  # fmt: skip
    for condition in ("base", "fixed"):
        (layer,) = result.results.conditions[condition]
        scores = {s.metric: s.values[0] for s in layer.scores}
        assert set(scores) == {"miou", "pixel_acc"} and all(0 <= v <= 1 for v in scores.values())
        assert layer.yardsticks[0].name == "majority class"
        assert layer.info.logit_scale == 65.0
    assert result.results.fix.method == "naclip"


def test_resize_keeps_the_aspect_with_the_long_side_capped():
    assert resized_size(500, 375, 336) == (448, 336)  # 500 * 336 / 375 = 448
    assert resized_size(2048, 1024, 560) == (1120, 560)  # Cityscapes at 560
    assert resized_size(4000, 100, 336) == (2048, 51)  # long side held at 2048


def test_protocol_class_lists_match_the_readers():
    sizes = {"voc": VOC_CLASSES, "voc20": VOC_CLASSES[1:], "context60": CONTEXT60_CLASSES,
             "context59": CONTEXT60_CLASSES[1:], "coco-object": COCO_OBJECT_CLASSES,
             "coco-stuff": COCO_STUFF_CLASSES, "cityscapes": CITYSCAPES_CLASSES,
             "ade20k": ADE20K_CLASSES}  # fmt: skip
    assert set(sizes) == set(PROTOCOLS)
    for name, classes in sizes.items():
        assert len(protocol_names(PROTOCOLS[name].names)) == len(classes), name
    assert protocol_names("context60")[0] == ["background"]  # prompted as the word itself
    assert protocol_names("coco-object")[0] == list(BACKGROUND_NAMES)
    assert len(protocol_names("voc21")[15]) == 7  # person and its six variants
    assert PROTOCOLS["coco-stuff"].short_side == 448 and PROTOCOLS["cityscapes"].short_side == 560


def test_confusion_counts_give_the_pooled_miou():
    g = torch.Generator().manual_seed(3)
    pred = torch.randint(0, 5, (3, 7, 9), generator=g)
    target = torch.randint(0, 4, (3, 7, 9), generator=g)  # class 4 only ever predicted
    target[0, :2] = 255
    counts = confusion(pred, target, 5)
    assert int(counts.sum()) == int((target != 255).sum())
    assert miou_of(counts) == pytest.approx(miou(pred, target, 5, 255), abs=1e-6)


def test_non_square_images_are_resized_keeping_aspect_and_scored_at_mask_size(
    clip_model, task
) -> None:
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (24, 40, 3), np.uint8))
    sample = Sample(image, "wide", mask=np.zeros((24, 40), np.int64))
    smaller = copy.copy(task)  # the module's task keeps its settings
    smaller.short_side = 32
    item = smaller.prepare(sample, input_config(clip_model))
    assert item["image"].shape == (3, 32, 53) and item["mask"].shape == (24, 40)
    with torch.no_grad():
        pred = smaller.outputs(clip_model, item["image"][None], (24, 40))
    assert pred.shape == (1, 24, 40)


def _context60(root: Path) -> None:
    voc = root / "VOC2010"
    rng = np.random.default_rng(1)
    for key, (h, w) in (("a", (24, 40)), ("b", (36, 20)), ("c", (24, 40))):
        (voc / "JPEGImages").mkdir(parents=True, exist_ok=True)
        (voc / "SegmentationClassContext").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), np.uint8)).save(
            voc / "JPEGImages" / f"{key}.jpg"
        )
        mask = rng.choice([0, 15, 37, 255], (h, w)).astype(np.uint8)
        Image.fromarray(mask).save(voc / "SegmentationClassContext" / f"{key}.png")
    (voc / "ImageSets" / "SegmentationContext").mkdir(parents=True)
    (voc / "ImageSets" / "SegmentationContext" / "val.txt").write_text("a\nb\nc\n")


@pytest.mark.slow  # about 10 s on a shared CPU (60 classes through the text tower)
def test_context60_run_scores_non_square_images_at_their_own_size(
    clip_model, templates, tmp_path
) -> None:
    _context60(tmp_path)
    data = f"context60:{tmp_path}"
    result = run(clip_model, "ov-seg", data, cache_dir=tmp_path, batch_size=2,
                 templates=templates, image_size=40)  # fmt: skip
    (layer,) = result.results.conditions["base"]
    assert layer.info.num_classes == 60 and layer.info.logit_scale == 50.0
    assert layer.info.area_thd is None and layer.info.short_side == 40
    assert result.results.caches["base/test"].forward_passes == 3  # sizes differ: a, b, c apart
    by_hand = OvSeg()
    ds = open_dataset(data, "val")
    by_hand.setup(clip_model, ds, {"templates": templates, "image_size": 40})
    preds, masks = [], []
    for i in range(len(ds)):
        item = by_hand.prepare(ds[i], input_config(clip_model))
        with torch.no_grad():
            preds.append(by_hand.outputs(clip_model, item["image"][None], item["mask"].shape))
        masks.append(item["mask"][None])
    flat = [torch.cat([t.flatten().long() for t in ts]) for ts in (preds, masks)]
    scores = {s.metric: s.values[0] for s in layer.scores}
    assert scores["miou"] == pytest.approx(miou(flat[0], flat[1], 60, 255), abs=1e-6)
