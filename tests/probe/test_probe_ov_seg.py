"""Open-vocabulary segmentation on a tiny random-init open_clip CLIP: crop offsets, the pixel
predictions against a hand computation of the protocol, the sliding window, and a probe run
with and without a last-block fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import vitreg
from vitreg.data.datasets import open_dataset
from vitreg.fix.naclip import NACLIP
from vitreg.probe.run import run
from vitreg.probe.tasks.ov_seg import BACKGROUND_NAMES, OvSeg, windows

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
        (layer,) = result.results[condition]
        scores = {s.metric: s.values[0] for s in layer.scores}
        assert set(scores) == {"miou", "pixel_acc"} and all(0 <= v <= 1 for v in scores.values())
        assert layer.yardsticks[0].name == "majority class"
        assert layer.info["logit_scale"] == 65.0
    assert result.fix["method"] == "naclip"
