"""A randomised family of planted circuits: the automatic path tested on circuits it was not
built beside.

``random_circuit(arch, seed, **ranges)`` samples, from ``seed`` alone, a small timm ViT and a
circuit planted into it with the machinery of :mod:`vitreg.testing.planted.planted_circuits`, and returns
``(module, GroundTruth)`` like :func:`vitreg.testing.planted.build`. What is sampled (each within
:class:`Ranges`, which the keyword arguments override):

* the architecture: DINOv2 (LayerScale), DeiT-III (LayerScale, no position embedding on [CLS]),
  CLIP (a real pre-norm, QuickGELU), SigLIP (no [CLS], average pooling), EVA-style (SwiGLU MLP,
  no LayerScale; timm's VisionTransformer with that block design -- timm's ``Eva`` class with
  rotary embeddings is not planted into); depth 7-9, width 96-192, a 4-6 patch grid;
* 2 to 40 causal units over 1 to 4 blocks: weak groups before the emergence block (together at
  most 2.6x the median, no outlier mode: each unit creates nothing alone), the emergence group
  (4-12x) and up to 2 amplifier groups *after* emergence that keep writing the outlier (they read
  the flag, so they are writers wherever they sit), to a final 4-25x; unequal unit strengths;
  writes along 1 to 3 directions;
* readers in blocks after emergence (they read the outlier direction, so fire only on tokens that
  already are outliers) writing along it or along another direction; texture, [CLS]-only and
  position-tied distractors;
* the token rule: flat patches (texture energy < 0.05), low-variance patches (< 0.10-0.16), a
  few fixed grid positions, or a random subset (5-15%) of positions; attention sinks or none.

``random_unplanted`` is the same architecture and random weights without the plant. Seeds 0-4
are pinned to the cases the issue names (:data:`FEATURED`); every other seed samples freely.
:func:`vitreg.testing.planted.check_circuit` verifies a circuit against its truth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from vitreg.errors import InputError
from vitreg.testing.planted._weights import THRESHOLD, Group, Spec, create, random_init
from vitreg.testing.planted.planted_circuits import MODE_RATIO, Options, build_circuit
from vitreg.testing.planted.truth import GroundTruth

#: family name -> (timm architecture, its model arguments beside width/depth/heads, patch size)
ARCHS: dict[str, tuple[str, dict[str, Any], int]] = {
    "dinov2": ("vit_small_patch14_dinov2", {}, 14),
    "deit3": ("deit3_small_patch16_224", {}, 16),
    "clip": ("vit_base_patch16_clip_quickgelu_224", {}, 16),
    "siglip": ("vit_base_patch16_siglip_224", {"global_pool": "avg"}, 16),
    "eva": ("vit_giant_patch14_dinov2", {"init_values": 0.0}, 14),
}
RULES = ("flat", "lowvar", "positions", "random")


@dataclass(frozen=True)
class Ranges:
    """What :func:`sample` draws from; integer pairs are inclusive ``(low, high)``."""

    archs: tuple[str, ...] = tuple(ARCHS)
    depth: tuple[int, int] = (7, 9)
    widths: tuple[int, ...] = (96, 128, 192)
    grid: tuple[int, int] = (4, 6)  # patches per side
    causal: tuple[int, int] = (2, 40)  # causal units in all (log-uniform)
    blocks: tuple[int, int] = (1, 4)  # blocks holding causal units
    after: tuple[int, int] = (0, 2)  # of those, blocks after the emergence block
    ratio: tuple[float, float] = (4.0, 25.0)  # final outlier ratio (selected median / median)
    directions: tuple[int, int] = (1, 3)
    readers: tuple[int, int] = (0, 4)  # reader groups (1-2 units each)
    rules: tuple[str, ...] = RULES
    sink: float = 0.7  # probability of attention sinks


#: seeds pinned to hard cases (many causes over several blocks, a lone rule, SigLIP, no sinks);
#: other seeds sample every field
FEATURED: dict[int, dict[str, Any]] = {
    0: dict(
        archs=("dinov2",),
        causal=(6, 6),
        blocks=(3, 3),
        after=(2, 2),
        readers=(2, 2),
        rules=("flat",),
    ),
    1: dict(causal=(40, 40), blocks=(4, 4), after=(1, 1)),
    2: dict(causal=(32, 32), blocks=(3, 3), after=(0, 0), rules=("flat",)),
    3: dict(archs=("siglip",)),
    4: dict(sink=0.0, after=(1, 2), blocks=(2, 3)),
}


@dataclass(frozen=True)
class CircuitSample:
    """One sampled circuit: the architecture and what is planted into it."""

    seed: int
    arch: str
    depth: int
    width: int
    img_size: int
    groups: tuple[Group, ...]
    options: Options
    rule: str

    @property
    def name(self) -> str:
        return f"family:{self.arch}:{self.seed}"

    @property
    def spec(self) -> Spec:
        timm_name, args, _ = ARCHS[self.arch]
        heads = self.width // 32
        args = dict(embed_dim=self.width, depth=self.depth, num_heads=heads, **args)
        causes = [gr for gr in self.groups if gr.role == "cause"]
        text = (
            f"{self.arch} depth {self.depth} width {self.width}: {sum(g.n for g in causes)} "
            f"causal units in blocks {sorted({g.layer for g in causes})}, rule {self.rule}"
        )
        return Spec(timm_name, text, (), (), args, self.groups)


def _ranges(seed: int, given: dict[str, Any]) -> Ranges:
    known = {f.name for f in fields(Ranges)}
    bad = sorted(set(given) - known)
    if bad:
        raise InputError(f"unknown plant-family range(s) {bad}; known: {sorted(known)}")
    return replace(Ranges(), **{**FEATURED.get(seed, {}), **given})


def draw_int(g: torch.Generator, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]`` (inclusive) from ``g``."""
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def draw_uniform(g: torch.Generator, lo: float, hi: float, log: bool = False) -> float:
    """A float in ``[lo, hi)`` from ``g``, uniform or (``log``) log-uniform."""
    u = float(torch.rand(1, generator=g))
    if log:
        return math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    return lo + u * (hi - lo)


def draw_choice(g: torch.Generator, options: tuple) -> Any:
    """One of ``options`` drawn from ``g``."""
    return options[draw_int(g, 0, len(options) - 1)]


def draw_split(g: torch.Generator, total: int, parts: int) -> list[int]:
    """``total`` units over ``parts`` groups, each at least 1, randomly unequal."""
    weights = torch.rand(parts, generator=g) + 0.3
    extra = total - parts
    counts = [1 + int(w) for w in (extra * weights / weights.sum()).floor().tolist()]
    for i in range(total - sum(counts)):
        counts[i % parts] += 1
    return counts


def sample(seed: int, arch: str | None = None, **ranges: Any) -> CircuitSample:
    """The circuit that ``seed`` (and ``arch``, when given) draws from :class:`Ranges`."""
    r = _ranges(seed, ranges)
    g = torch.Generator().manual_seed(1_000_003 * (seed + 1))
    arch = arch or r.archs[seed % len(r.archs)]  # every run of consecutive seeds covers them
    if arch not in ARCHS:
        raise InputError(f"unknown plant-family architecture {arch!r}; known: {sorted(ARCHS)}")
    patch = ARCHS[arch][2]
    width = draw_choice(g, r.widths)
    side = draw_int(g, *r.grid)
    n_causal = round(draw_uniform(g, r.causal[0], r.causal[1] + 0.49, log=True))
    n_blocks = min(draw_int(g, *r.blocks), n_causal)
    n_after = min(draw_int(g, *r.after), n_blocks - 1)
    n_before = n_blocks - 1 - n_after
    depth = max(draw_int(g, *r.depth), 5 + n_before + n_after)
    # blocks: 0-1 hold the flag; weak ones, emergence, amplifiers; two blocks left for readers
    emergence = draw_int(g, 2 + n_before, depth - 3 - n_after)
    counts = draw_split(g, n_causal, n_blocks)
    dirs = draw_int(g, *r.directions)
    others = [f"v{i}" for i in range(1, dirs)]
    groups: list[Group] = []
    weak = sorted(draw_uniform(g, 1.3, 2.6) for _ in range(n_before))
    for i, target in enumerate(weak):
        writes = others[i % len(others)] if others else "v"
        layer = emergence - n_before + i
        groups.append(Group("cause", layer, counts[i], "flag", writes, target, 25.0, equal=True))
    steps = [draw_uniform(g, 1.3, 2.0) for _ in range(n_after)]
    lo, hi = r.ratio
    final = draw_uniform(g, max(lo, MODE_RATIO * math.prod(steps)), hi, log=True)
    strong = final / math.prod(steps)
    reads = "flag/v" if n_before else "flag"
    act = draw_uniform(g, 40.0, 60.0)
    groups.append(Group("cause", emergence, counts[n_before], reads, "v", strong, act))
    level = strong
    for i, step in enumerate(steps):
        level *= step
        # another direction only for a small step: readers need cos(outlier, v) > 0.4
        writes = others[(n_before + i) % len(others)] if others and step < 1.6 else "v"
        n = counts[n_before + 1 + i]
        groups.append(Group("cause", emergence + 1 + i, n, "flag", writes, level, act))
    for _ in range(draw_int(g, *r.readers)):
        layer = draw_int(g, emergence + 1, depth - 1)
        writes = "v" if torch.rand(1, generator=g) < 0.6 else "random"
        gain = draw_uniform(g, 0.05, 0.15)
        groups.append(Group("reader", layer, draw_int(g, 1, 2), "v", writes, gain, 150.0))
    tied: tuple[int, ...] = ()
    kinds = ["texture", "position"] + (["cls"] if arch != "siglip" else [])
    for kind in kinds:
        if torch.rand(1, generator=g) < 0.5:
            continue
        layer = draw_int(g, 2, depth - 2)
        if kind == "texture":
            groups.append(Group("texture", layer, draw_int(g, 1, 2), "flag", "random", 0.25, 30.0))
        elif kind == "cls":
            groups.append(Group("cls", layer, 1, "ref", "random", 0.3, 300.0))
        else:
            tied = tuple(sorted(torch.randperm(side * side, generator=g)[:3].tolist()))
            groups.append(Group("position", layer, 1, "pos", "random", 0.25, 30.0))
    rule = draw_choice(g, r.rules)
    positions: tuple[int, ...] = ()
    threshold = THRESHOLD
    if rule == "lowvar":
        threshold = draw_uniform(g, 0.10, 0.16)
    elif rule == "positions":
        n = side * side
        corners = (0, side - 1, n - side, n - 1, (side // 2) * side + side // 2)
        positions = tuple(sorted(corners[i] for i in torch.randperm(5, generator=g)[:3].tolist()))
    elif rule == "random":
        k = max(2, round(draw_uniform(g, 0.05, 0.15) * side * side))
        positions = tuple(sorted(torch.randperm(side * side, generator=g)[:k].tolist()))
    sinks = bool(torch.rand(1, generator=g) < r.sink)
    options = Options(threshold, positions, rule, dirs, sinks, tied)
    order = sorted(groups, key=lambda gr: (gr.layer, gr.role != "cause"))
    return CircuitSample(seed, arch, depth, width, patch * side, tuple(order), options, rule)


def random_circuit(
    arch: str | None = None, seed: int = 0, **ranges: Any
) -> tuple[nn.Module, GroundTruth]:
    """The planted circuit ``seed`` draws (``arch``: one of :data:`ARCHS`, else drawn too)."""
    s = sample(seed, arch, **ranges)
    return build_circuit(s.name, s.spec, s.img_size, seed, s.options)


def random_unplanted(arch: str | None = None, seed: int = 0, **ranges: Any) -> nn.Module:
    """The same architecture and random weights as ``random_circuit(arch, seed, **ranges)``, with
    no plant: what "as clean as the model without the plant" is measured against."""
    s = sample(seed, arch, **ranges)
    module = create(s.spec, s.img_size)
    with torch.no_grad():
        random_init(module, torch.Generator().manual_seed(seed + 7919))
    return module.eval()
