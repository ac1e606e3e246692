"""Attention-map zero-shot segmentation (Jiang et al. Table 4, the protocol of Chefer et al. /
``clip_text_span``): the last block's [CLS] attention over the patches, averaged over heads,
upsampled bilinearly to the mask size, min-max normalised per image and thresholded at its mean;
foreground = every labelled class but the background (class 0). mIoU over {background,
foreground} with pixels pooled over the test split, pixel accuracy, and the per-image mean
average precision of the normalised map. Nothing is trained."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitreg.errors import InputError
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model
from vitreg.probe.metrics import IGNORE_INDEX
from vitreg.probe.tasks.base import TaskResult, register_task, score_over_seeds
from vitreg.probe.tasks.model_task import ModelTask
from vitreg.probe.yardsticks import ProbeYardstick, yardstick
from vitreg.results.probe import TaskInfo

FEATURE = "[CLS] attention (mean of heads)"
SITE = "attn.hook_pattern"


def cls_attention(pattern: Tensor, hook: HookContext) -> Tensor:
    """``[B, H, N, N]`` attention -> the [CLS] query's row over the patch keys, mean of heads,
    as the patch grid ``[B, h, w]`` (registers, test-time registers and [CLS] left out)."""
    layout = hook.layout
    row = layout.cls_token(pattern.float().mean(1), dim=1)
    return layout.take(row, "patches", dim=1).reshape(-1, *layout.grid)


def binarise(maps: Tensor, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Per image: the map upsampled (bilinear) to ``size``, clipped at 0 and min-max normalised,
    and the foreground where it exceeds its own mean (``[n, H, W]`` float, bool)."""
    # layout: the channel axis interpolate needs, not tokens
    up = F.interpolate(maps[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]
    up = up.clamp_min(0)
    lo = up.amin((1, 2), keepdim=True)
    span = (up.amax((1, 2), keepdim=True) - lo).clamp_min(1e-12)
    norm = (up - lo) / span
    return norm, norm > norm.mean((1, 2), keepdim=True)


def average_precision(score: Tensor, positive: Tensor) -> float:
    """Area under the precision-recall step curve (ties grouped, as scikit-learn's AP)."""
    order = score.argsort(descending=True)
    s, y = score[order], positive[order].double()
    tp, fp = y.cumsum(0), (1 - y).cumsum(0)
    last = torch.cat([(s[1:] != s[:-1]).nonzero().flatten(), torch.tensor([len(s) - 1])])
    tp, fp = tp[last], fp[last]
    precision, recall = tp / (tp + fp), tp / tp[-1]
    steps = torch.diff(recall, prepend=torch.zeros(1, dtype=recall.dtype))
    return float((steps * precision).sum())


CHUNK = 64  # images upsampled at once: memory stays bounded on large splits


def _truth(masks: Tensor) -> tuple[Tensor, Tensor]:
    """Foreground (every id but 0) and valid (not IGNORE_INDEX) pixels of ``masks``."""
    return (masks != 0) & (masks != IGNORE_INDEX), masks != IGNORE_INDEX


def pooled_iou(pred: Tensor, fg: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Intersections and unions of {background, foreground} over the valid pixels."""
    p, t = pred[valid], fg[valid]
    inter = torch.stack([(~p & ~t).sum(), (p & t).sum()]).double()
    union = torch.stack([(~p | ~t).sum(), (p | t).sum()]).double()
    return inter, union


def mean_iou(inter: Tensor, union: Tensor) -> float:
    """Mean IoU over the classes present in prediction or truth."""
    present = union > 0
    return float((inter[present] / union[present]).mean()) if present.any() else math.nan


def segmentation_scores(maps: Tensor, masks: Tensor) -> dict[str, float]:
    """mIoU (pixels pooled over the split), pixel accuracy and mAP of thresholded attention
    ``maps [n, h, w]`` against ``masks [n, H, W]`` (0 background, IGNORE_INDEX ignored, any
    other id foreground), ``CHUNK`` images at a time."""
    inter, union = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    correct = labelled = fg_pixels = 0
    aps, skipped = [], 0
    for i in range(0, len(masks), CHUNK):
        fg, valid = _truth(masks[i : i + CHUNK].long())
        norm, pred = binarise(maps[i : i + CHUNK], tuple(masks.shape[1:]))
        a, b = pooled_iou(pred, fg, valid)
        inter, union = inter + a, union + b
        correct += int((pred == fg)[valid].sum())
        labelled += int(valid.sum())
        fg_pixels += int(fg.sum())
        for score, y, v in zip(norm, fg, valid, strict=True):
            y = y[v]
            if y.all() or not y.any():  # one class only: AP of the other is undefined
                skipped += 1
                continue
            aps.append((average_precision(score[v], y) + average_precision(1 - score[v], ~y)) / 2)
    return {
        "miou": mean_iou(inter, union),
        "pixel_acc": correct / labelled if labelled else math.nan,
        "map": sum(aps) / len(aps) if aps else math.nan,
        "map_images": len(aps),
        "map_skipped": skipped,
        "foreground_fraction": fg_pixels / labelled if labelled else math.nan,
    }


def centre_maps(n: int, grid: tuple[int, int]) -> Tensor:
    """A map that falls off with the distance from the image centre, ``[n, h, w]``."""
    h, w = grid
    r = torch.arange(h, dtype=torch.float32) - (h - 1) / 2
    c = torch.arange(w, dtype=torch.float32) - (w - 1) / 2
    return -(r[:, None] ** 2 + c[None] ** 2).sqrt().expand(n, h, w)


def segmentation_yardsticks(masks: Tensor, grid: tuple[int, int]) -> list[ProbeYardstick]:
    """What maps that know nothing of the image score: every pixel one class, and a centred
    map put through the same protocol (objects tend to sit in the middle)."""
    fg, valid = _truth(masks.long())
    out = []
    for name, value in (("all foreground", True), ("all background", False)):
        pred = torch.full(fg.shape, value)
        text = f"every pixel called {name.split()[1]}"
        out.append(yardstick(name, "miou", mean_iou(*pooled_iou(pred, fg, valid)), text))
        acc = float((pred == fg)[valid].double().mean()) if valid.any() else math.nan
        out.append(yardstick(name, "pixel_acc", acc, text))
    centre = segmentation_scores(centre_maps(len(masks), grid), masks)
    text = "distance to the image centre as the map, thresholded as the attention is"
    out += [yardstick("centre prior", m, centre[m], text) for m in ("miou", "pixel_acc", "map")]
    return out


@register_task
class AttentionSeg(ModelTask):
    name = "attention-seg"
    description = (
        "zero-shot segmentation from the last block's mean-of-heads [CLS] attention, "
        "thresholded at its mean (Chefer et al. protocol); mIoU, pixel accuracy, mAP"
    )
    target = "mask"
    metrics = {"miou": True, "pixel_acc": True, "map": True}

    def setup(self, model: Model, dataset: Any, options: dict[str, Any]) -> list[str]:
        """Check the model has a [CLS] and the dataset a background class 0."""
        names = dataset.class_names or []
        spec = dataset.describe().get("spec", dataset.name)
        if not names or names[0].lower() not in ("background", "bg", "_background_"):
            first = repr(names[0]) if names else "no class names"
            raise InputError(
                f"attention-seg scores foreground against background and {spec} has no "
                f"background class 0 ({first}); use masks with 0 = background (voc:DIR, "
                "synthetic-seg:n=...)"
            )
        if model.layout.n_cls != 1:
            raise InputError(
                f"attention-seg reads the [CLS] token's attention and {model.spec} has "
                f"{model.layout.n_cls} [CLS] tokens; use a ViT with one"
            )
        return []

    def layer(self, model: Model) -> str:
        return hook_name(model.n_layers - 1, SITE)

    def outputs(self, model: Model, x: Tensor) -> Tensor:
        name = self.layer(model)
        _, cache = model.run_with_cache(
            x, names=[name], reduce=cls_attention, stop_at_layer=model.stop_layer([name])
        )
        return cache[name]

    def keep(self, targets: Tensor) -> Tensor:
        """Masks as uint8 0 background / 1 foreground / IGNORE_INDEX: all the scores read."""
        fg = (targets != 0).to(torch.uint8)
        return torch.where(targets == IGNORE_INDEX, IGNORE_INDEX, fg).to(torch.uint8)

    def score(self, outputs: Tensor, targets: Tensor, layer: str) -> TaskResult:
        found = segmentation_scores(outputs, targets)
        n = len(targets)
        scores = [score_over_seeds(FEATURE, m, [found[m]], True, n_test=n) for m in self.metrics]
        notes = []
        if found["map_skipped"]:
            notes.append(
                f"mAP over {found['map_images']} images; {found['map_skipped']} hold only "
                "foreground or only background, where AP is undefined"
            )
        info = TaskInfo(
            map_images=int(found["map_images"]),
            map_skipped=int(found["map_skipped"]),
            foreground_fraction=float(found["foreground_fraction"]),
            threshold="per-image mean",
        )
        marks = segmentation_yardsticks(targets, tuple(outputs.shape[1:]))
        return TaskResult(self.name, layer, scores, notes, info, marks)
