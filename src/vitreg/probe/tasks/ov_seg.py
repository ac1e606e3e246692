"""CLIP open-vocabulary segmentation, the protocol SCLIP introduced and NACLIP, ClearCLIP and
SC-CLIP reuse (``wangf3014/SCLIP``: ``clip_segmentor.py``, ``configs/cfg_*.py``): every patch's
projected CLIP feature against class-name text embeddings (OpenAI's 80 ImageNet templates,
prompt-ensembled), logits upsampled bilinearly to the pixels, sliding 1x crops with half
stride when the image is larger than the model's input, ``softmax(logit_scale * cos)``.

Background (masks whose class 0 is ``background``, VOC21 / Context60 / COCO-Object): class 0
is prompted by the published stuff names; a pixel whose top probability is below ``prob_thd``
is background; with ``area_thd`` a foreground class covering less than that share of an
image's foreground pixels is dropped there (SCLIP's VOC21 settings: scale 65, 0.1, 0.1).
Without background: scale 40, no thresholds. Scores: mIoU and pixel accuracy over the pooled
pixels. The fix (if any) reaches the scores through the patch features only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitreg.errors import InputError
from vitreg.models.model import Model
from vitreg.models.text_tower import text_tower
from vitreg.probe import ov_seg_data  # noqa: F401  (registers voc20:, cityscapes:)
from vitreg.probe.metrics import IGNORE_INDEX, miou
from vitreg.probe.tasks.base import Score, TaskResult, register_task
from vitreg.probe.yardsticks import Yardstick
from vitreg.probe.zero_shot.base import ModelTask
from vitreg.probe.zero_shot.class_cache import cached_class_embeddings
from vitreg.probe.zero_shot.prompts import class_names, openai_templates, read_templates
from vitreg.probe.zero_shot.text import clip_towers

FEATURE = "clip patch embedding"
BACKGROUND = ("background", "bg", "_background_")
# the names SCLIP/NACLIP prompt for VOC21's background class (configs/cls_voc21.txt)
BACKGROUND_NAMES = (
    "sky", "wall", "tree", "wood", "grass", "road", "sea", "river", "mountain", "sands", "desk",
    "bed", "building", "cloud", "lamp", "door", "window", "wardrobe", "ceiling", "shelf",
    "curtain", "stair", "floor", "hill", "rail", "fence",
)  # fmt: skip
WITH_BACKGROUND = {"logit_scale": 65.0, "prob_thd": 0.1, "area_thd": 0.1}
WITHOUT_BACKGROUND = {"logit_scale": 40.0, "prob_thd": 0.0, "area_thd": None}


def patch_embeddings(model: Model, x: Tensor) -> Tensor:
    """``[B, h, w, D]`` projected CLIP features of every patch (open_clip or HF CLIP)."""
    tokens = model.features(x)
    layout = model.adapter.layout_for(tuple(x.shape[-2:]))
    grid = layout.patch_grid(tokens)
    if model.family == "open_clip-vit":
        if not model.adapter.ln_post_on_tokens or model.module.proj is None:
            raise InputError(
                "ov-seg needs ln_post on every token and a projection (CLIP ViT towers); this "
                "open_clip tower pools before its final norm"
            )
        return grid @ model.module.proj
    if model.family == "hf-clip":
        clip, _ = text_tower(model.module).get()
        return clip.visual_projection(model.adapter.tower.post_layernorm(grid))
    raise InputError(
        f"ov-seg projects patch features into CLIP's text space; {model.family} models have "
        "no such projection (load open_clip:ARCH/TAG or hf:openai/clip-vit-...)"
    )


def windows(size: int, crop: int) -> list[int]:
    """Start offsets of crops of ``crop`` with stride ``crop // 2`` covering ``size`` (the
    last one flush with the end, as the official ``forward_slide``)."""
    if size <= crop:
        return [0]
    stride = crop // 2
    n = -(-(size - crop) // stride) + 1
    return [min(i * stride, size - crop) for i in range(n)]


@register_task
class OvSeg(ModelTask):
    """Dense CLIP zero-shot segmentation against the dataset's class names."""

    name = "ov-seg"
    description = (
        "open-vocabulary segmentation (SCLIP protocol): patch features against class-name "
        "prompts, sliding window, background by probability threshold; mIoU, pixel accuracy"
    )
    target = "mask"
    metrics = {"miou": True, "pixel_acc": True}

    def setup(self, model: Model, dataset: Any, options: dict[str, Any]) -> list[str]:
        """Class embeddings of every name of every class, and the protocol's settings."""
        self.towers = clip_towers(model)
        spec = dataset.describe().get("spec", dataset.name)
        names, notes = class_names(dataset.class_names, spec)
        self.background = names[0].lower() in BACKGROUND
        per_class = [[n] for n in names]
        if self.background:
            per_class[0] = list(BACKGROUND_NAMES)
            notes.append("class 0 is background: prompted by the protocol's 26 stuff names")
        self.owner = torch.tensor([c for c, ns in enumerate(per_class) for _ in ns])
        flat = [n for ns in per_class for n in ns]
        path = options.get("templates")
        templates = read_templates(path) if path is not None else openai_templates()
        self.classes, _, _ = cached_class_embeddings(
            self.towers, flat, templates, options.get("cache_dir")
        )
        self.k = len(per_class)
        self.settings = dict(WITH_BACKGROUND if self.background else WITHOUT_BACKGROUND)
        self.crop = model.adapter.default_image_size()
        self.info = {"num_classes": self.k, "prompts_per_class": len(templates), **self.settings}
        return notes

    def layer(self, model: Model) -> str:
        return "patch embedding"

    def logits(self, model: Model, x: Tensor) -> Tensor:
        """Cosine ``[B, names, H, W]`` at pixel resolution, sliding crops where ``x`` is larger
        than the model's input (overlaps averaged)."""
        b, _, h, w = x.shape
        ch, cw = min(self.crop[0], h), min(self.crop[1], w)
        out = x.new_zeros(b, len(self.owner), h, w)
        count = x.new_zeros(1, 1, h, w)
        text = F.normalize(self.classes.to(x), dim=-1)
        for top in windows(h, ch):
            for left in windows(w, cw):
                crop = x[..., top : top + ch, left : left + cw]
                cos = F.normalize(patch_embeddings(model, crop).float(), dim=-1) @ text.T
                up = F.interpolate(cos.permute(0, 3, 1, 2), size=(ch, cw), mode="bilinear")
                out[..., top : top + ch, left : left + cw] += up
                count[..., top : top + ch, left : left + cw] += 1
        return out / count

    def outputs(self, model: Model, x: Tensor) -> Tensor:
        """The predicted class of every pixel ``[B, H, W]`` (protocol post-processing)."""
        probs = torch.softmax(self.logits(model, x) * self.settings["logit_scale"], dim=1)
        owner = self.owner.to(probs.device)
        per_class = probs.new_zeros(probs.shape[0], self.k, *probs.shape[2:])
        per_class.scatter_reduce_(1, owner.view(1, -1, 1, 1).expand_as(probs), probs, "amax")
        if self.background and self.settings["area_thd"]:
            pred = per_class.argmax(1)
            area = F.one_hot(pred, self.k).sum((1, 2)).float()  # [B, K]
            fg = area[:, 1:]  # layout: classes (0 = background), not tokens
            keep = fg > self.settings["area_thd"] * fg.sum(1, keepdim=True)
            per_class[:, 1:] *= keep[..., None, None]  # layout: foreground classes
        top, pred = per_class.max(1)
        if self.background:
            pred = torch.where(top < self.settings["prob_thd"], 0, pred)
        return pred.to(torch.int16).cpu()

    def score(self, outputs: Tensor, targets: Tensor, layer: str) -> TaskResult:
        pred, target = outputs.long(), targets.long()
        valid = target != IGNORE_INDEX
        n = len(targets)
        acc = float((pred[valid] == target[valid]).float().mean()) if valid.any() else 0.0
        scores = [
            Score(FEATURE, "miou", [miou(pred, target, self.k, IGNORE_INDEX)], True, n_test=n),
            Score(FEATURE, "pixel_acc", [acc], True, n_test=n),
        ]
        return TaskResult(self.name, layer, scores, [], dict(self.info), [majority(target, self.k)])


def majority(target: Tensor, k: int) -> Yardstick:
    """mIoU of labelling every pixel with the test masks' most frequent class (nothing here is
    trained, so the test split is the only one read)."""
    valid = target[target != IGNORE_INDEX]
    cls = int(torch.bincount(valid, minlength=k).argmax()) if len(valid) else 0
    value = miou(torch.full_like(target, cls), target, k, IGNORE_INDEX)
    text = f"every pixel labelled class {cls}, the test masks' most frequent"
    return Yardstick("majority class", "miou", value, text)
