"""CLIP open-vocabulary segmentation, the protocol SCLIP introduced and NACLIP, ClearCLIP and
SC-CLIP reuse (``wangf3014/SCLIP`` @ ``b56bd30``: ``clip_segmentor.py``, ``configs/cfg_*.py``):
every patch's projected CLIP feature against class-name text embeddings (OpenAI's 80 ImageNet
templates, prompt-ensembled), logits upsampled bilinearly to the pixels, sliding 1x crops with
half stride, ``softmax(logit_scale * cos)``, a class scored by the best of its names.

Each image keeps its aspect: its short side is resized to the benchmark's size (336 px; 448 for
COCO-Stuff, 560 for Cityscapes; the long side at most 2048, mmseg's ``Resize(scale=(2048, S),
keep_ratio=True)``), crops of the model's input size slide over it, and the logits are
upsampled back to the mask's own size, where the scores are taken (mmseg's ``ori_shape``).
The benchmarks the protocol names (``voc``, ``voc20``, ``context60``, ``context59``,
``coco-object``, ``coco-stuff``, ``cityscapes``, ``ade20k``) prompt the protocol's class-name
lists (``ov_seg_classes/*.txt``: the configs' ``cls_*.txt``, several names per class where
they give several) with their settings (:data:`PROTOCOLS`).

Background (class 0 ``background``): a pixel whose top probability is below ``prob_thd`` is
background; with ``area_thd`` a foreground class covering less than that share of an image's
foreground pixels is dropped there (VOC21: scale 65, 0.1, 0.1; Context60 and COCO-Object: scale
50, 0.1). Without background: scale 40, no thresholds. Another dataset with a class 0
``background`` is treated as VOC21 (its class 0 prompted by VOC21's 26 stuff names). Optional
PAMR refinement of the upsampled logits (``pamr_steps``; :mod:`vitreg.probe.pamr`). Scores:
mIoU and pixel accuracy over all pixels pooled (a confusion matrix; mmseg's ``IoUMetric``).
The fix (if any) reaches the scores through the patch features only.

These are the shared settings (``protocol`` ``shared``). Under ``published`` each condition
takes its fix method's own settings for the benchmark (:mod:`vitreg.probe.protocols`: scale,
thresholds, short side, crop and stride, PAMR, class names), the unfixed model the shared ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vitreg.data.datasets import Sample
from vitreg.errors import InputError
from vitreg.fix.base import Fix, fix_description
from vitreg.fix.ov_stitcher import active_stitcher
from vitreg.models.model import Model
from vitreg.models.text_tower import text_tower
from vitreg.probe import ov_seg_data  # noqa: F401  (registers voc20:, context60:, coco-stuff:, ...)
from vitreg.probe.metrics import IGNORE_INDEX
from vitreg.probe.pamr import DILATIONS, pamr
from vitreg.probe.protocols import benchmark_of, protocol_named, protocol_note, record
from vitreg.probe.tasks.base import TaskResult, register_task, score_over_seeds
from vitreg.probe.tasks.model_task import ModelTask
from vitreg.probe.yardsticks import ProbeYardstick, yardstick
from vitreg.probe.zero_shot.class_cache import cached_class_embeddings
from vitreg.probe.zero_shot.prompts import class_names, openai_templates, read_templates
from vitreg.probe.zero_shot.text import clip_towers
from vitreg.results.fix import FixDescription
from vitreg.results.probe import OvSegProtocolRecord, TaskInfo
from vitreg.settings.ov_seg import OvSegSettings

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
LONG_SIDE = 2048  # mmseg's Resize(scale=(2048, short side), keep_ratio=True)
NAMES = Path(__file__).resolve().parents[1] / "ov_seg_classes"


@dataclass(frozen=True)
class Protocol:
    """One benchmark of the protocol: its class-name list (a file in ``ov_seg_classes/``), the
    short side its images are resized to, and its post-processing settings."""

    names: str
    short_side: int = 336
    logit_scale: float = 40.0
    prob_thd: float = 0.0
    area_thd: float | None = None

    def settings(self) -> dict[str, float | None]:
        return {
            "logit_scale": self.logit_scale,
            "prob_thd": self.prob_thd,
            "area_thd": self.area_thd,
        }


#: dataset name -> the SCLIP config it follows (``configs/cfg_*.py``)
PROTOCOLS = {
    "voc": Protocol("voc21", 336, 65.0, 0.1, 0.1),
    "voc20": Protocol("voc20"),
    "context60": Protocol("context60", 336, 50.0, 0.1),
    "context59": Protocol("context59"),
    "coco-object": Protocol("coco-object", 336, 50.0, 0.1),
    "coco-stuff": Protocol("coco-stuff", 448),
    "cityscapes": Protocol("cityscapes", 560),
    "ade20k": Protocol("ade20k"),
}


def shared_settings(benchmark: str, crop: int) -> OvSegSettings:
    """The shared protocol's settings for ``benchmark`` on a model taking ``crop`` px."""
    p = next(p for p in PROTOCOLS.values() if p.names == benchmark)
    return OvSegSettings(
        names=p.names,
        short_side=p.short_side,
        logit_scale=p.logit_scale,
        prob_thd=p.prob_thd,
        area_thd=p.area_thd,
        slide_crop=crop,
        slide_stride=crop // 2,
        pamr_steps=0,
        pamr_dilations=DILATIONS,
    )


def fix_method(fix: FixDescription) -> str:
    """The method name a fix's published settings are filed under (its class without one)."""
    return getattr(fix, "method", None) or fix.name


def protocol_record(
    protocol: str, method: str | None, dataset: str, model: Model
) -> OvSegProtocolRecord:
    """The settings ``method`` (None: the unfixed model) runs with on the benchmark that the
    reader ``dataset`` reads, under ``protocol``, on ``model``."""
    benchmark = benchmark_of(dataset)
    crop = model.adapter.default_image_size()[0]
    return record(
        protocol_named(protocol), method, benchmark, shared_settings(benchmark, crop), crop
    )


def protocol_names(name: str) -> list[list[str]]:
    """The names prompted for each class of a benchmark (one line per class, ``, `` between a
    class's names, as the configs' ``cls_*.txt``)."""
    lines = (NAMES / f"{name}.txt").read_text(encoding="utf-8").splitlines()
    return [line.split(", ") for line in lines if line.strip()]


def resized_size(width: int, height: int, short: int) -> tuple[int, int]:
    """``(w, h)`` after mmseg's keep-ratio resize: the short side to ``short`` unless the long
    side would pass :data:`LONG_SIDE` (then the long side to that), rounded half up."""
    scale = min(LONG_SIDE / max(width, height), short / min(width, height))
    return int(width * scale + 0.5), int(height * scale + 0.5)


def confusion(pred: Tensor, target: Tensor, k: int) -> Tensor:
    """``[k, k]`` pixel counts (row: true class, column: predicted), ignored pixels left out."""
    valid = target != IGNORE_INDEX
    index = target[valid].long() * k + pred[valid].long()
    return torch.bincount(index, minlength=k * k).view(k, k)


def miou_of(counts: Tensor) -> float:
    """Mean IoU over the classes present in the prediction or the target, from a confusion
    matrix (dataset-level, as mmseg's ``IoUMetric`` and :func:`vitreg.probe.metrics.miou`)."""
    inter = counts.diagonal().double()
    union = counts.sum(0).double() + counts.sum(1).double() - inter
    present = union > 0
    return float((inter[present] / union[present]).mean()) if present.any() else 0.0


def patch_embeddings(model: Model, x: Tensor) -> Tensor:
    """``[B, h, w, D]`` projected CLIP features of every patch (open_clip or HF CLIP)."""
    tokens = model.features(x)
    layout = model.adapter.layout_for(tuple(x.shape[-2:]))
    return project(model, layout.patch_grid(tokens))


def project(model: Model, grid: Tensor) -> Tensor:
    """Final patch tokens ``[B, h, w, C]`` (as ``features`` returns them) into CLIP's text
    space."""
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


def windows(size: int, crop: int, stride: int | None = None) -> list[int]:
    """Start offsets of crops of ``crop`` with ``stride`` (default ``crop // 2``) covering
    ``size`` (the last one flush with the end, as the official ``forward_slide``)."""
    if size <= crop:
        return [0]
    stride = stride or crop // 2
    n = -(-(size - crop) // stride) + 1
    return [min(i * stride, size - crop) for i in range(n)]


@register_task
class OvSeg(ModelTask):
    """Dense CLIP zero-shot segmentation against the dataset's class names."""

    name = "ov-seg"
    description = (
        "open-vocabulary segmentation (SCLIP protocol): patch features against class-name "
        "prompts, aspect kept, sliding window, background by probability threshold; mIoU, "
        "pixel accuracy"
    )
    target = "mask"
    metrics = {"miou": True, "pixel_acc": True}
    protocol = "shared"
    stride: tuple[int, int] | None = None

    def setup(self, model: Model, dataset: Any, options: dict[str, Any]) -> list[str]:
        """Class embeddings of every name of every class, and the protocol's settings.

        ``options``: ``templates``, ``cache_dir``, ``image_size`` (the short side instead of
        the benchmark's), ``pamr_steps`` (0: off) and ``pamr_dilations``."""
        self.towers = clip_towers(model)
        spec = dataset.describe().get("spec", dataset.name)
        names, notes = class_names(dataset.class_names, spec)
        self.background = names[0].lower() in BACKGROUND
        self.protocol = protocol_named(options.get("protocol"))
        self.stride: tuple[int, int] | None = None
        path = options.get("templates")
        self.templates = read_templates(path) if path is not None else openai_templates()
        self.cache_dir = options.get("cache_dir")
        self.crop = model.adapter.default_image_size()
        if self.protocol == "published":
            return notes + self._published(dataset, spec, len(names), options)
        protocol = PROTOCOLS.get(getattr(dataset, "name", ""))
        if protocol is not None:
            per_class = protocol_names(protocol.names)
            if len(per_class) != len(names):
                raise InputError(
                    f"{spec} has {len(names)} classes but the protocol's {protocol.names} list "
                    f"names {len(per_class)}"
                )
            self.settings = protocol.settings()
            short = protocol.short_side
            notes.append(f"prompts: the protocol's class names ({protocol.names}, SCLIP's configs)")
        else:
            per_class = [[n] for n in names]
            if self.background:
                per_class[0] = list(BACKGROUND_NAMES)
                notes.append("class 0 is background: prompted by the protocol's 26 stuff names")
            self.settings = dict(WITH_BACKGROUND if self.background else WITHOUT_BACKGROUND)
            short = None
        self._prompt(per_class)
        self.short_side = options.get("image_size") or short or min(self.crop)
        self.pamr_steps = int(options.get("pamr_steps") or 0)
        self.pamr_dilations = tuple(options.get("pamr_dilations") or DILATIONS)
        self.info = self._task_info()
        return notes

    def _prompt(self, per_class: list[list[str]]) -> None:
        """Class embeddings of every name of every class (``owner``: the class of each name)."""
        self.owner = torch.tensor([c for c, ns in enumerate(per_class) for _ in ns])
        flat = [n for ns in per_class for n in ns]
        self.classes, _, _ = cached_class_embeddings(
            self.towers, flat, self.templates, self.cache_dir
        )
        self.k = len(per_class)

    def _task_info(self, record: OvSegProtocolRecord | None = None) -> TaskInfo:
        """What the scores were taken with (``record``: the published protocol's settings)."""
        dilations = {"pamr_dilations": list(self.pamr_dilations)} if self.pamr_steps else {}
        protocol = {"protocol": record} if record is not None else {}
        return TaskInfo.model_validate(
            {
                "num_classes": self.k,
                "prompts_per_class": len(self.templates),
                **self.settings,
                "short_side": self.short_side,
                "crop": list(self.crop),
                "pamr_steps": self.pamr_steps,
                **dilations,
                **protocol,
            }
        )

    def _published(self, dataset: Any, spec: str, k: int, options: dict[str, Any]) -> list[str]:
        """Setup under ``--protocol published``: the benchmark; each condition then takes its
        method's settings (:meth:`condition`), the unfixed model the shared ones."""
        if options.get("pamr_steps"):
            raise InputError(
                "--protocol published takes PAMR from each method's published settings; drop "
                "--pamr (or run --protocol shared)"
            )
        if self.crop[0] != self.crop[1]:
            raise InputError(
                f"--protocol published slides square crops; this model takes {list(self.crop)}"
            )
        self.benchmark = benchmark_of(getattr(dataset, "name", ""))
        self.spec, self.num_classes, self.names = spec, k, ""
        self.condition(None)
        return []

    def condition(self, fix: Fix | None) -> list[str]:
        """Under ``--protocol published``: take the settings of ``fix``'s method for the
        benchmark (the shared ones without a fix or a published entry); a note says which."""
        if self.protocol == "shared":
            return []
        method = None if fix is None else fix_method(fix_description(fix))
        shared = shared_settings(self.benchmark, self.crop[0])
        found = record(self.protocol, method, self.benchmark, shared, self.crop[0])
        used = found.settings
        if used.names != self.names:
            per_class = protocol_names(used.names)
            if len(per_class) != self.num_classes:
                raise InputError(
                    f"{self.spec} has {self.num_classes} classes but the {used.names} list "
                    f"names {len(per_class)}"
                )
            self._prompt(per_class)
            self.names = used.names
        self.settings = {
            "logit_scale": used.logit_scale,
            "prob_thd": used.prob_thd,
            "area_thd": used.area_thd,
        }
        self.short_side = used.short_side
        self.stride = (used.slide_stride, used.slide_stride)
        self.pamr_steps, self.pamr_dilations = used.pamr_steps, tuple(used.pamr_dilations)
        self.info = self._task_info(found)
        return [protocol_note(found)]

    def layer(self, model: Model) -> str:
        return "patch embedding"

    def prepare(
        self, sample: Sample, config: dict[str, int | list[float]]
    ) -> dict[str, Tensor | str]:
        """The image resized keeping its aspect (short side :attr:`short_side`, bilinear on the
        8-bit pixels as mmseg's resize, rounded back to 8 bits) and normalised; the mask at its
        own size."""
        image = np.asarray(sample.image.convert("RGB"), dtype=np.float32)
        w, h = resized_size(image.shape[1], image.shape[0], self.short_side)
        x = torch.from_numpy(image).permute(2, 0, 1)[None]
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
        x = x[0].round().clamp(0, 255) / 255.0
        mean = torch.tensor(config["mean"], dtype=torch.float32).view(3, 1, 1)
        std = torch.tensor(config["std"], dtype=torch.float32).view(3, 1, 1)
        mask = torch.from_numpy(np.asarray(sample.mask, dtype=np.int64))
        return {"key": sample.key, "image": (x - mean) / std, "mask": mask}

    def logits(self, model: Model, x: Tensor) -> Tensor:
        """Cosine ``[B, names, H, W]`` at pixel resolution, sliding crops where ``x`` is larger
        than the model's input (overlaps averaged; under OV-Stitcher the crops' tokens are
        stitched into one final block instead)."""
        b, _, h, w = x.shape
        ch, cw = min(self.crop[0], h), min(self.crop[1], w)
        out = x.new_zeros(b, len(self.owner), h, w, dtype=torch.float32)
        count = x.new_zeros(1, 1, h, w, dtype=torch.float32)
        text = F.normalize(self.classes.to(x.device, torch.float32), dim=-1)
        sh, sw = self.stride or (None, None)
        tops, lefts = windows(h, ch, sh), windows(w, cw, sw)
        stitcher = active_stitcher(model)
        if stitcher is not None and len(tops) * len(lefts) > 1:  # one global final block
            grid = stitcher.stitched(model, x, (ch, cw), tops, lefts)
            cos = F.normalize(project(model, grid).float(), dim=-1) @ text.T
            return F.interpolate(cos.permute(0, 3, 1, 2), size=(h, w), mode="bilinear")
        for top in tops:
            for left in lefts:
                crop = x[..., top : top + ch, left : left + cw]
                cos = F.normalize(patch_embeddings(model, crop).float(), dim=-1) @ text.T
                up = F.interpolate(cos.permute(0, 3, 1, 2), size=(ch, cw), mode="bilinear")
                out[..., top : top + ch, left : left + cw] += up
                count[..., top : top + ch, left : left + cw] += 1
        return out / count

    def outputs(self, model: Model, x: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        """The predicted class of every pixel ``[B, H, W]`` at ``size`` (default: ``x``'s),
        after the protocol's post-processing."""
        logits = self.logits(model, x)
        if size is not None and tuple(size) != tuple(logits.shape[-2:]):
            logits = F.interpolate(logits, size=tuple(size), mode="bilinear")
        if self.pamr_steps:
            image = F.interpolate(x.float(), size=logits.shape[-2:], mode="bilinear")
            logits = pamr(image, logits, self.pamr_steps, self.pamr_dilations)
        probs = torch.softmax(logits * self.settings["logit_scale"], dim=1)
        owner = self.owner.to(probs.device)
        per_class = probs.new_zeros(probs.shape[0], self.k, *probs.shape[2:])
        per_class.scatter_reduce_(1, owner.view(1, -1, 1, 1).expand_as(probs), probs, "amax")
        if self.settings["area_thd"]:
            pred = per_class.argmax(1)
            area = F.one_hot(pred, self.k).sum((1, 2)).float()  # [B, K]
            fg = area[:, 1:]  # layout: classes (0 = background), not tokens
            keep = fg > self.settings["area_thd"] * fg.sum(1, keepdim=True)
            per_class[:, 1:] *= keep[..., None, None]  # layout: foreground classes
        top, pred = per_class.max(1)
        if self.settings["prob_thd"]:
            pred = torch.where(top < self.settings["prob_thd"], 0, pred)
        return pred.to(torch.int16).cpu()

    def run_batch(self, model: Model, x: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """``([1, K, K] confusion counts, [B] scored pixels per image)`` of images of one size,
        predicted at their masks' size."""
        pred = self.outputs(model, x, tuple(targets.shape[-2:]))
        counts = confusion(pred, targets, self.k)
        return counts[None], (targets != IGNORE_INDEX).flatten(1).sum(1)

    def score(self, outputs: Tensor, targets: Tensor, layer: str) -> TaskResult:
        counts = outputs.sum(0).long() if len(outputs) else torch.zeros(self.k, self.k).long()
        n = len(targets)
        total = int(counts.sum())
        acc = float(counts.diagonal().sum()) / total if total else 0.0
        scores = [
            score_over_seeds(FEATURE, "miou", [miou_of(counts)], True, n_test=n),
            score_over_seeds(FEATURE, "pixel_acc", [acc], True, n_test=n),
        ]
        return TaskResult(self.name, layer, scores, [], self.info.model_copy(), [majority(counts)])


def majority(counts: Tensor) -> ProbeYardstick:
    """mIoU of labelling every pixel with the test masks' most frequent class (nothing here is
    trained, so the test split is the only one read)."""
    truth = counts.sum(1)
    cls = int(truth.argmax()) if int(truth.sum()) else 0
    only = torch.zeros_like(counts)
    only[:, cls] = truth
    text = f"every pixel labelled class {cls}, the test masks' most frequent"
    return yardstick("majority class", "miou", miou_of(only), text)
