"""Planted-artifact ViTs: real timm architectures, seeded random weights, planted register neurons.

No pretrained weights can be downloaded where vitreg is built and tested, so detection, neuron
discovery and fixes are tested against these fixtures. ``build(name)`` returns the source timm
module and its :class:`GroundTruth`. The plant is made by editing weights only (no hooks, no
extra modules), so the module saves and loads as a plain timm checkpoint.

The planted mechanism mimics trained register neurons (Darcet et al. 2024; Jiang et al. 2025):

* ``patch_embed`` gets ``K`` zero-mean high-frequency filters (texture channels); flat patches
  give exactly zero there.
* block 0's MLP sums ``|filter response|`` against a constant reference channel into an energy
  channel (both divided by the same LayerNorm scale, so its sign does not depend on the rest of
  the token); block 1's MLP turns that sign into a bounded "flat" flag with a sharp ramp. The
  model's decision matches :meth:`GroundTruth.outlier_mask` to within ~3% of the threshold.
* ``n`` units of the first planted layer fire only where the flag is set and write a large
  vector; from that layer on the selected patches have residual norms of tens of times the
  median patch norm. Units of the next layer read that direction and reinforce it (outlier norms
  grow with depth), and later layers' keys make the outliers attention sinks.

A reserved zero channel is read alongside every reserved channel, which cancels LayerNorm's mean
and makes the flat/textured decision independent of the rest of the token. Random writes into
the reserved channels are removed up to the first planted layer.

:class:`GroundTruth` gives each unit a role: causal units (the first planted layer), readers
(the next one) and, in the fixtures of :mod:`vitreg.testing.planted_circuits` (``groups`` in
their specs), causes spread over several blocks, strong downstream readers and distractors.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError, SpecError
from vitreg.models.input_size import check_built_size


@dataclass(frozen=True)
class _Group:
    """``n`` units of one role in block ``layer`` of a role-annotated fixture (planted_circuits).

    ``reads``: "flag" (the flat flag), "v" (cosine with the outlier direction after LayerNorm),
    "flag/v" (the flag plus that cosine, weighted so that the input does not change, to first
    order, when earlier writes along ``v`` are removed and LayerNorm's scale shrinks), "ref" (the
    patch-vs-prefix reference channel). ``writes``: "v" or "random" (a fixed
    direction orthogonal to ``v``). ``target``: for causes, the flat patches' median norm over
    the median patch norm at the block output; for readers, their relative norm gain; for
    distractors, their write norm relative to the median patch ([CLS]) norm. ``act``: median
    activation of the units where they fire. ``equal``: the units write equal shares (the same
    write norm at their median activation) instead of randomly weighted ones.
    """

    role: str  # "cause" | "reader" | "texture" | "cls"
    layer: int
    n: int
    reads: str
    writes: str
    target: float
    act: float
    equal: bool = False


@dataclass(frozen=True)
class _Spec:
    architecture: str
    description: str
    layers: tuple[int, ...]
    n_units: tuple[int, ...]
    args: dict = field(default_factory=dict)
    groups: tuple[_Group, ...] = ()  # role-annotated fixtures: built by planted_circuits


SPECS: dict[str, _Spec] = {
    "dinov2_s14": _Spec(
        "vit_small_patch14_dinov2",
        "DINOv2 ViT-S/14 (LayerScale), register neurons in layers 6-7 fire on flat patches",
        (6, 7),
        (3, 2),
    ),
    "dinov2_s14_reg4": _Spec(
        "vit_small_patch14_reg4_dinov2",
        "DINOv2 ViT-S/14 with 4 register tokens (outliers still land on patches); layers 6-7",
        (6, 7),
        (3, 2),
    ),
    "dinov2_s14_swiglu": _Spec(
        "vit_giant_patch14_dinov2",
        "DINOv2-g block design (SwiGLUPacked MLP, SiLU) at ViT-S/14 width; neurons in layers 5-6",
        (5, 6),
        (3, 2),
        dict(embed_dim=384, depth=12, num_heads=6),
    ),
    "clip_b16": _Spec(
        "vit_base_patch16_clip_quickgelu_224",
        "OpenAI CLIP ViT-B/16 tower (norm_pre, QuickGELU); neurons in layers 6-7",
        (6, 7),
        (4, 2),
    ),
    "clip_t16": _Spec(
        "vit_base_patch16_clip_quickgelu_224",
        "CLIP ViT/16 tower at tiny width (192, 3 heads, 10 blocks; norm_pre, QuickGELU); "
        "neurons in layers 6-7 (the timm twin of hf_clip_t16)",
        (6, 7),
        (4, 2),
        dict(embed_dim=192, num_heads=3, depth=10),
    ),
    "deit3_s16": _Spec(
        "deit3_small_patch16_224",
        "DeiT-III ViT-S/16 (LayerScale, no pos-embed on [CLS]); neurons in layers 5-6",
        (5, 6),
        (3, 2),
    ),
    "dinov2_s14_early": _Spec(
        "vit_small_patch14_dinov2",
        "DINOv2 ViT-S/14: 3 register neurons in block 2 create 20x outliers on flat patches; "
        "readers in blocks 5 and 8 reinforce them",
        (),
        (),
        groups=(
            _Group("cause", 2, 3, "flag", "v", 20.0, 60.0),
            _Group("reader", 5, 1, "v", "v", 0.15, 150.0),
            _Group("reader", 8, 1, "v", "v", 0.15, 150.0),
        ),
    ),
    "dinov2_s14_multiblock": _Spec(
        "vit_small_patch14_dinov2",
        "DINOv2 ViT-S/14: weak register neurons in blocks 2-3 (flat patches at 2.5x the median, "
        "no outlier mode) and strong ones in block 4 add up to 25x outliers; strong readers in "
        "blocks 6-9; texture and [CLS] distractors",
        (),
        (),
        groups=(
            _Group("texture", 2, 1, "flag", "random", 0.25, 30.0),
            _Group("cause", 2, 2, "flag", "v", 2.0, 25.0, equal=True),
            _Group("cls", 3, 1, "ref", "random", 0.3, 300.0),
            _Group("cause", 3, 2, "flag", "v", 2.5, 25.0, equal=True),
            _Group("texture", 4, 1, "flag", "random", 0.25, 30.0),
            _Group("cls", 4, 1, "ref", "random", 0.3, 300.0),
            _Group("cause", 4, 2, "flag/v", "v", 25.0, 40.0),
            *(_Group("reader", layer, 1, "v", "v", 0.1, 150.0) for layer in (6, 7, 8, 9)),
        ),
    ),
}

# design constants of the circuit (dimensionless; see the module docstring)
N_FILTERS = 16
THRESHOLD = 0.05  # mean |filter response| of a preprocessed patch; ~ pixel std 0.06
NORM_RATIO = 40.0  # target median outlier norm / median patch norm at the first planted layer
_TERM = 20.0  # |abs-unit input| per filter at the threshold: keeps GELU/SiLU near |x|
_KAPPA = 0.25  # energy channel after LayerNorm per unit of (energy / threshold - 1)
_STEP = 40.0  # slope of the flat-flag ramp in units of (energy / threshold)
_RAMP = 6.0  # height of that ramp (pre-activation units)
_FLAG = 4.0  # flat flag after LayerNorm at the first planted layer
_FLAG_T = 1.0  # planted units fire above this flag value


def list_planted() -> dict[str, str]:
    """Planted fixture names with one-line descriptions."""
    from vitreg.testing.planted_hf import HF_FIXTURES
    from vitreg.testing.planted_kinds import KINDS

    return {
        **{name: spec.description for name, spec in SPECS.items()},
        **{name: fixture.description for name, fixture in HF_FIXTURES.items()},
        **{name: kind.description for name, kind in KINDS.items()},
    }


def _spec(name: str) -> _Spec:
    if name not in SPECS:
        raise SpecError(f"unknown planted model {name!r}; known: {sorted(SPECS)}")
    return SPECS[name]


def texture_filters(patch_size: int, n_filters: int, seed: int) -> torch.Tensor:
    """``[K, 3, P, P]`` unit-norm filters with zero mean per colour channel (0 on flat patches)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_filters, 3, patch_size, patch_size, generator=g)
    w = w - w.mean(dim=(2, 3), keepdim=True)
    return w / w.flatten(1).norm(dim=1)[:, None, None, None]


@dataclass(frozen=True)
class FlatRule:
    """Which patches the planted neurons fire on: texture energy below ``threshold``.

    Texture energy of a preprocessed patch is the mean absolute response of ``n_filters``
    zero-mean random filters (``texture_filters(patch_size, n_filters, filter_seed)``); it is
    about 0.8 x the patch's pixel standard deviation, so the rule is roughly "pixel std <
    ``approx_std``" in normalised units (flat background, sky, walls).
    """

    patch_size: int
    threshold: float
    n_filters: int
    filter_seed: int

    @property
    def approx_std(self) -> float:
        return self.threshold / math.sqrt(2 / math.pi)

    @property
    def text(self) -> str:
        return (
            f"flat: patches whose texture energy (mean |response| of {self.n_filters} zero-mean "
            f"filters, preprocessed pixels) is < {self.threshold:g}, i.e. pixel std < "
            f"~{self.approx_std:.2f}"
        )

    def filters(self) -> torch.Tensor:
        return texture_filters(self.patch_size, self.n_filters, self.filter_seed)

    def texture_energy(self, images: torch.Tensor) -> torch.Tensor:
        """Per-patch texture energy ``[B, h, w]`` of preprocessed images ``[B, 3, H, W]``."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise InputError(
                f"expected preprocessed images [B, 3, H, W], got {tuple(images.shape)}"
            )
        p = self.patch_size
        if images.shape[-1] % p or images.shape[-2] % p:
            raise InputError(f"image size {tuple(images.shape[-2:])} is not a multiple of {p}")
        w = self.filters().to(images.device)
        return F.conv2d(images.float(), w, stride=p).abs().mean(dim=1)

    def mask(self, images: torch.Tensor) -> torch.Tensor:
        """Bool ``[B, h, w]``: the patches of preprocessed ``images`` the rule selects."""
        return self.texture_energy(images) < self.threshold

    def ambiguous(self, images: torch.Tensor, band: float) -> torch.Tensor:
        """Patches within ``band`` (relative) of the threshold, where the model's ramp is partial."""
        ratio = self.texture_energy(images) / self.threshold
        return (ratio > 1 - band) & (ratio < 1 + band)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "approx_std": self.approx_std, "text": self.text}


@dataclass(frozen=True)
class PositionRule:
    """Which patches the planted neurons fire on: fixed grid positions, whatever the image.

    ``positions`` index the row-major patch grid ``grid``; ``kind`` says how they were drawn
    ("positions": a few fixed positions, "random": a random subset). The flag is written by the
    position embedding, so no upstream circuit reads the pixels.
    """

    patch_size: int
    grid: tuple[int, int]
    positions: tuple[int, ...]
    kind: str = "positions"

    @property
    def text(self) -> str:
        return f"{self.kind}: patches at grid positions {list(self.positions)} of {self.grid}"

    def mask(self, images: torch.Tensor) -> torch.Tensor:
        """Bool ``[B, h, w]``: the selected positions, for every image."""
        h, w = self.grid
        if images.dim() != 4 or tuple(images.shape[-2:]) != (
            h * self.patch_size,
            w * self.patch_size,
        ):
            raise InputError(
                f"expected preprocessed images [B, 3, {h * self.patch_size}, "
                f"{w * self.patch_size}], got {tuple(images.shape)}"
            )
        m = torch.zeros(h * w, dtype=torch.bool, device=images.device)
        m[list(self.positions)] = True
        return m.view(1, h, w).expand(images.shape[0], h, w)

    def ambiguous(self, images: torch.Tensor, band: float) -> torch.Tensor:
        """No patch is near a threshold: an empty mask."""
        return torch.zeros_like(self.mask(images))

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "grid": list(self.grid),
            "positions": list(self.positions),
            "text": self.text,
        }


@dataclass(frozen=True)
class GroundTruth:
    """What was planted in a fixture: where, which units, on which tokens, how strongly.

    ``units`` are ``(layer, unit)`` pairs indexing ``blocks.{layer}.mlp.hook_post``. From
    ``blocks.{first_outlier_layer}.hook_resid_post`` on, patches selected by
    :meth:`outlier_mask` have norms around ``expected_norm_ratio`` x the median patch norm;
    ``helper_units`` are the upstream circuit (texture energy in block 0, flat flag in block 1).

    ``rule`` is a :class:`FlatRule` (texture energy) or, in the plant family, a
    :class:`PositionRule`. ``writer_layers``: the blocks whose units write the outliers (the
    causal blocks, before and after emergence); ``target_ratio``: the selected patches' median
    norm over the median patch norm after the last writer block (``expected_norm_ratio`` is the
    ratio at emergence).

    Roles: ``causal_units`` is the minimal set whose zeroing removes the outliers;
    ``reader_units`` fire because a token already is an outlier (they read its direction) and
    reinforce it; ``units`` is causal + reader units. ``distractor_units`` are
    ``(layer, unit, kind)`` with kind "texture" (fire on textured patches), "cls" (fire on
    [CLS] only) or "position" (fire on textured patches at fixed positions); they do not touch
    the outliers. ``emergence_layer`` is the first block whose
    output shows the outlier mode (= ``first_outlier_layer``; causal blocks may follow it).
    """

    name: str
    architecture: str
    model_args: dict
    seed: int
    layers: tuple[int, ...]
    units: tuple[tuple[int, int], ...]
    rule: FlatRule | PositionRule
    first_outlier_layer: int
    expected_norm_ratio: float
    sink_layers: tuple[int, ...]
    helper_units: tuple[tuple[int, int, str], ...]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    causal_units: tuple[tuple[int, int], ...] = ()
    reader_units: tuple[tuple[int, int], ...] = ()
    distractor_units: tuple[tuple[int, int, str], ...] = ()
    emergence_layer: int | None = None  # None: first_outlier_layer
    writer_layers: tuple[int, ...] = ()  # (): the causal units' blocks
    target_ratio: float | None = None  # None: expected_norm_ratio

    def __post_init__(self) -> None:
        if self.emergence_layer is None:
            object.__setattr__(self, "emergence_layer", self.first_outlier_layer)
        if not self.writer_layers:
            layers = tuple(sorted({layer for layer, _ in self.causal_units}))
            object.__setattr__(self, "writer_layers", layers)
        if self.target_ratio is None:
            object.__setattr__(self, "target_ratio", self.expected_norm_ratio)

    def units_by_layer(self, role: str = "all") -> dict[int, list[int]]:
        """Units per layer; ``role``: "all" (causal + readers), "causal" or "reader"."""
        pairs = {"all": self.units, "causal": self.causal_units, "reader": self.reader_units}
        if role not in pairs:
            raise InputError(f"role must be one of {sorted(pairs)}, got {role!r}")
        out: dict[int, list[int]] = {}
        for layer, unit in pairs[role]:
            out.setdefault(layer, []).append(unit)
        return out

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Preprocess images in [0, 1] with the model's mean/std."""
        mean = torch.tensor(self.mean, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=images.device).view(1, 3, 1, 1)
        return (images - mean) / std

    def texture_energy(self, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.rule, FlatRule):
            raise InputError(f"{self.name}: a position rule reads no texture energy")
        return self.rule.texture_energy(images)

    def outlier_mask(self, images: torch.Tensor) -> torch.Tensor:
        """Bool ``[B, h, w]``: the patches of preprocessed ``images`` the rule selects."""
        return self.rule.mask(images)

    def ambiguous_mask(self, images: torch.Tensor, band: float = 0.05) -> torch.Tensor:
        """Patches within ``band`` (relative) of the threshold, where the model's ramp is partial."""
        return self.rule.ambiguous(images, band)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            rule=self.rule.to_dict(),
            layers=list(self.layers),
            units=[list(u) for u in self.units],
            sink_layers=list(self.sink_layers),
            helper_units=[list(u) for u in self.helper_units],
            causal_units=[list(u) for u in self.causal_units],
            reader_units=[list(u) for u in self.reader_units],
            distractor_units=[list(u) for u in self.distractor_units],
            writer_layers=list(self.writer_layers),
            mean=list(self.mean),
            std=list(self.std),
        )
        return d


# construction ---------------------------------------------------------------------------
def _create(spec: _Spec, img_size: int) -> nn.Module:
    """The timm architecture with uninitialised parameters, built fast on the meta device."""
    import timm

    args = dict(img_size=img_size, num_classes=0, **spec.args)
    module = timm.create_model(spec.architecture, pretrained=False, device="meta", **args)
    check_built_size(module, f"the planted {spec.architecture}")  # before it is calibrated
    return module.to_empty(device="cpu")


def _layout(module: nn.Module) -> TokenLayout:
    pe = module.patch_embed
    n_cls = 1 if getattr(module, "cls_token", None) is not None else 0
    grid = tuple(int(s) for s in pe.grid_size)
    return TokenLayout(n_cls, int(module.num_reg_tokens), grid, tuple(pe.patch_size))


class _Init:
    """Seeded in-place initialisation that remembers which parameters it has written."""

    def __init__(self, g: torch.Generator) -> None:
        self.g = g
        self.done: set[int] = set()

    def normal(self, p: torch.Tensor, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        self.done.add(id(p))
        return p.normal_(mean, std, generator=self.g)

    def ln(self, norm: nn.Module) -> None:
        if isinstance(norm, nn.LayerNorm):
            self.normal(norm.weight, 1.0, 0.1).clamp_(0.6, 1.4)
            self.normal(norm.bias, 0.0, 0.05)

    def linear(self, lin: nn.Linear, gain: float, bias_mean: float, bias_std: float) -> None:
        self.normal(lin.weight, 0.0, gain / math.sqrt(lin.in_features))
        if lin.bias is not None:
            self.normal(lin.bias, bias_mean, bias_std)

    def missing(self, module: nn.Module) -> list[str]:
        return [n for n, p in module.named_parameters() if id(p) not in self.done]


def _pos_grid(grid: tuple[int, int], d: int, g: torch.Generator) -> torch.Tensor:
    """Smooth positional embedding ``[h*w, d]``: one random plane wave per channel."""
    h, w = grid
    yy, xx = torch.meshgrid(torch.arange(h) / h, torch.arange(w) / w, indexing="ij")
    fy, fx = (3 * torch.rand(2, d, generator=g) - 1.5).unbind(0)
    phase = 2 * math.pi * torch.rand(d, generator=g)
    arg = 2 * math.pi * (yy.flatten()[:, None] * fy + xx.flatten()[:, None] * fx) + phase
    return 0.5 * torch.sin(arg)


def _random_init(module: nn.Module, g: torch.Generator) -> None:
    """Seeded weights with trained-like scales (LayerScale ~0.1-0.5, [CLS]/registers O(1))."""
    init = _Init(g)
    d = module.embed_dim
    layout = _layout(module)
    pe = module.patch_embed.proj
    p = pe.weight.shape[-1]
    smooth = F.interpolate(torch.randn(d, 3, 4, 4, generator=g), size=(p, p), mode="bilinear")
    filt = smooth + 0.3 * init.normal(pe.weight)
    filt -= 0.8 * filt.mean(dim=(2, 3), keepdim=True)  # colour matters, but does not dominate
    pe.weight.copy_(0.25 * filt / filt.flatten(1).norm(dim=1)[:, None, None, None])
    if pe.bias is not None:
        init.normal(pe.bias, 0.0, 0.1)
    for tok in (module.cls_token, module.reg_token):
        if tok is not None:
            init.normal(tok, 0.0, 0.5)
    pos = init.normal(module.pos_embed, 0.0, 0.3)[0]  # [CLS]/register positions keep these
    pos[-layout.n_patches :] = _pos_grid(layout.grid, d, g)
    init.ln(module.norm_pre)
    layer_scale = hasattr(module.blocks[0].ls1, "gamma")
    branch = 1.0 if layer_scale else 0.3
    for blk in module.blocks:
        init.ln(blk.norm1)
        init.ln(blk.norm2)
        init.linear(blk.attn.qkv, 1.0, 0.0, 0.1)
        blk.attn.qkv.weight[: 2 * d] *= 1.5  # q and k: peakier attention than a plain init
        init.linear(blk.attn.proj, branch, 0.0, 0.02)
        mlp = blk.mlp
        init.linear(mlp.fc1, 1.0, -0.5, 0.3)
        hidden = mlp.fc2.in_features
        if mlp.fc1.out_features == 2 * hidden:  # GLU: the up half is linear
            up = slice(0, hidden) if mlp.gate_last else slice(hidden, 2 * hidden)
            mlp.fc1.bias[up] = 0.1 * torch.randn(hidden, generator=g)
        init.linear(mlp.fc2, branch, 0.0, 0.02)
        if layer_scale:
            for ls in (blk.ls1, blk.ls2):
                init.normal(ls.gamma, math.log(0.2), 0.5).exp_()
    init.ln(module.norm)
    init.ln(module.fc_norm)
    missing = init.missing(module)
    if missing:  # a timm change added parameters this initialisation does not know
        raise RuntimeError(f"planted init left parameters uninitialised: {missing[:5]}")


@dataclass
class _Plan:
    """Reserved residual channels and chosen units of one fixture."""

    zero: int
    ref: int
    energy: int
    flag: int
    texture: list[int]
    units: dict[int, list[int]]
    direction: torch.Tensor
    others: tuple[torch.Tensor, ...] = ()  # further write directions (plant family)
    position: int | None = None  # a channel set by the position embedding (plant family)

    @property
    def reserved(self) -> list[int]:
        extra = [] if self.position is None else [self.position]
        return [self.zero, self.ref, self.energy, self.flag, *self.texture, *extra]


def _plan(module: nn.Module, spec: _Spec, g: torch.Generator) -> _Plan:
    d = module.embed_dim
    hidden = module.blocks[0].mlp.fc2.in_features
    chans = torch.randperm(d, generator=g)[: 4 + N_FILTERS].tolist()
    counts = {
        0: 2 * N_FILTERS + 2,
        1: 2,
        spec.layers[0]: spec.n_units[0],
        spec.layers[1]: spec.n_units[1],
    }
    units = {
        layer: sorted(torch.randperm(hidden, generator=g)[:n].tolist())
        for layer, n in counts.items()
    }
    v = torch.randn(d, generator=g)
    v = v - v.mean()
    return _Plan(*chans[:4], chans[4:], units, v / v.norm())


def _reserve(module: nn.Module, plan: _Plan, protect: int, rule: FlatRule | PositionRule) -> None:
    """Embed texture filters and the constant reference; keep random writes off reserved channels
    in blocks ``0..protect``."""
    res = plan.reserved
    layout = _layout(module)
    pe = module.patch_embed.proj
    pe.weight[res] = 0
    if isinstance(rule, FlatRule):
        pe.weight[plan.texture] = rule.filters() * _gain_texture(rule.threshold)
    if pe.bias is not None:
        pe.bias[res] = 0
    module.pos_embed[..., res] = 0
    module.pos_embed[0, -layout.n_patches :, plan.ref] = 1.0
    for tok in (module.cls_token, module.reg_token):
        if tok is not None:
            tok[..., res] = 0
            tok[..., plan.ref] = -1.0  # prefix tokens look textured: never flagged
    norms = [module.norm_pre] + [n for b in module.blocks for n in (b.norm1, b.norm2)]
    for norm in norms:
        if isinstance(norm, nn.LayerNorm):
            norm.weight[res] = 1.0
            norm.bias[res] = 0.0
    for blk in module.blocks[: protect + 1]:
        for lin in (blk.attn.proj, blk.mlp.fc2):
            lin.weight[res] = 0
            lin.bias[res] = 0
        for ls in (blk.ls1, blk.ls2):
            if hasattr(ls, "gamma"):
                ls.gamma[res] = 1.0


def _gain_texture(threshold: float = THRESHOLD) -> float:
    """Embedding gain of the texture filters: 0.1 per channel at the threshold."""
    return 0.1 / threshold


@dataclass
class _Scales:
    s0: float  # LayerNorm-hat per raw embedding unit at block 0's MLP
    s1: float  # ... per raw residual unit at block 1's MLP
    s_plant: float  # ... at the first planted layer's MLP
    median_norm: float  # median patch norm after the first planted layer


class _Stop(Exception):
    """Ends the calibration forward after the first planted layer."""


def _calibrate(module: nn.Module, plan: _Plan, spec: _Spec, img_size: int) -> _Scales:
    """Measure LayerNorm scales and the median patch norm on a few synthetic images."""
    from vitreg.testing.images import synthetic_images

    cfg = module.pretrained_cfg
    mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    x = (synthetic_images(4, img_size, seed=12345) - mean) / std
    patches = _layout(module).patches
    first = spec.layers[0]
    blocks = module.blocks
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def grab(i: int):
        def hook(_m: nn.Module, args: tuple) -> None:
            t = args[0][:, patches].float()
            centred = t - t.mean(-1, keepdim=True)
            inv = (centred.pow(2).mean(-1, keepdim=True) + blocks[i].norm2.eps).rsqrt()
            seen[i] = (centred * inv, inv[..., 0])

        return hook

    def stop(_m: nn.Module, _a: tuple, out: torch.Tensor) -> None:
        seen[-1] = (out[:, patches].float().norm(dim=-1), out)
        raise _Stop

    handles = [blocks[i].norm2.register_forward_pre_hook(grab(i)) for i in (0, 1, first)]
    handles.append(blocks[first].register_forward_hook(stop))
    try:
        module.forward_features(x)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    hat0 = seen[0][0]
    return _Scales(
        s0=(hat0[..., plan.ref] - hat0[..., plan.zero]).median().item(),
        s1=seen[1][1].median().item(),
        s_plant=seen[first][1].median().item(),
        median_norm=seen[-1][0].median().item(),
    )


def _set_unit(mlp: nn.Module, j: int, w_in: torch.Tensor, b_in: float, w_out: torch.Tensor) -> None:
    """Make hidden unit ``j`` read ``w_in . ln(x) + b_in`` and write ``w_out`` (GLU: up = 1)."""
    hidden = mlp.fc2.in_features
    gate = j
    if mlp.fc1.out_features == 2 * hidden:
        gate, up = (j + hidden, j) if mlp.gate_last else (j, j + hidden)
        mlp.fc1.weight[up] = 0
        mlp.fc1.bias[up] = 1.0
    mlp.fc1.weight[gate] = w_in
    mlp.fc1.bias[gate] = b_in
    mlp.fc2.weight[:, j] = w_out


def _onehot(d: int, *pairs: tuple[int, float]) -> torch.Tensor:
    v = torch.zeros(d)
    for i, val in pairs:
        v[i] += val
    return v


def _plant_flag(module: nn.Module, plan: _Plan, sc: _Scales) -> list[tuple[int, int, str]]:
    """Blocks 0-1: the texture-energy channel and the flat flag (no random numbers drawn)."""
    d = module.embed_dim
    blocks = module.blocks
    z, k = plan.zero, N_FILTERS
    helpers: list[tuple[int, int, str]] = []
    # block 0: energy = c_e * (sum_k |G y_k| - lam * G_r r), all over the same LayerNorm scale
    gain = _TERM / (_gain_texture() * THRESHOLD * sc.s0)
    gain_ref = 1.0 / sc.s0
    lam = k * _TERM
    c_e = _KAPPA / (k * _TERM * sc.s1)
    u0 = plan.units[0]
    for i, ch in enumerate(plan.texture):
        for s, j in ((1, u0[2 * i]), (-1, u0[2 * i + 1])):
            _set_unit(
                blocks[0].mlp,
                j,
                _onehot(d, (ch, s * gain), (z, -s * gain)),
                0.0,
                _onehot(d, (plan.energy, c_e)),
            )
            helpers.append((0, j, "texture energy"))
    for s, j in ((1, u0[-2]), (-1, u0[-1])):
        w_in = _onehot(d, (plan.ref, s * gain_ref), (z, -s * gain_ref))
        _set_unit(blocks[0].mlp, j, w_in, 0.0, _onehot(d, (plan.energy, -s * c_e * lam)))
        helpers.append((0, j, "energy reference"))
    # block 1: flag = c_f * clamp(a (1 - energy/threshold) + h/2, 0, h) via two ramps
    a1 = _STEP / _KAPPA
    c_f = _FLAG / (_RAMP * sc.s_plant)
    ramps = zip((1, -1), plan.units[1], (_RAMP / 2, -_RAMP / 2), strict=True)
    for s, j, b in ramps:
        w_in = _onehot(d, (plan.energy, -a1), (z, a1))
        _set_unit(blocks[1].mlp, j, w_in, b, _onehot(d, (plan.flag, s * c_f)))
        helpers.append((1, j, "flat flag"))
    return helpers


def _plant(
    module: nn.Module, plan: _Plan, spec: _Spec, sc: _Scales, g: torch.Generator
) -> list[tuple[int, int, str]]:
    """Write the texture-energy, flat-flag, register-neuron and attention-sink weights."""
    helpers = _plant_flag(module, plan, sc)
    d = module.embed_dim
    blocks = module.blocks
    z = plan.zero
    first, second = spec.layers
    # first planted layer: act_j = a_j (flag - t); their writes sum to NORM_RATIO x median norm
    amps = 25 + 15 * torch.rand(len(plan.units[first]), generator=g)
    reads = [_onehot(d, (plan.flag, a), (z, -a)) for a in amps.tolist()]
    total = NORM_RATIO * sc.median_norm
    _write_units(
        blocks[first],
        plan.units[first],
        reads,
        -amps * _FLAG_T,
        amps * (_FLAG - _FLAG_T),
        plan.direction,
        total,
        g,
    )
    # second planted layer: reads the written direction after LayerNorm; outliers grow by half
    norm = blocks[second].norm2
    v = plan.direction
    amps2 = 6 + 3 * torch.rand(len(plan.units[second]), generator=g)
    t2 = 0.4 * math.sqrt(d)
    offset = float((v * norm.bias / norm.weight).sum())
    reads = [a * v / norm.weight for a in amps2.tolist()]
    acts2 = amps2 * (0.95 * math.sqrt(d) - t2)
    _write_units(
        blocks[second], plan.units[second], reads, -amps2 * (t2 + offset), acts2, v, total / 2, g
    )
    _sinks(module, v, range(first + 1, len(blocks)), g)
    return helpers


def _write_units(
    blk: nn.Module,
    units: list[int],
    reads: list[torch.Tensor],
    biases: torch.Tensor,
    acts: torch.Tensor,
    direction: torch.Tensor,
    total: float,
    g: torch.Generator,
) -> None:
    """Units read ``reads[i]`` and write near ``direction``; expected summed write has norm ``total``."""
    d = direction.numel()
    noise = torch.randn(len(units), d, generator=g)
    noise = noise - noise.mean(dim=1, keepdim=True)
    dirs = direction + 0.25 * noise / noise.norm(dim=1, keepdim=True)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    weights = 0.7 + 0.6 * torch.rand(len(units), generator=g)
    scale = total / (acts[:, None] * weights[:, None] * dirs).sum(0).norm()
    gamma = blk.ls2.gamma.detach() if hasattr(blk.ls2, "gamma") else torch.ones(d)
    for i, j in enumerate(units):
        _set_unit(blk.mlp, j, reads[i], float(biases[i]), scale * weights[i] * dirs[i] / gamma)


def _sinks(module: nn.Module, v: torch.Tensor, layers: range, g: torch.Generator) -> None:
    """Make tokens written along ``v`` attention sinks: keys gain a component along a q bias."""
    d = module.embed_dim
    for i in layers:
        blk = module.blocks[i]
        attn, norm = blk.attn, blk.norm1
        heads = attn.num_heads
        hd = d // heads
        read = v / norm.weight
        offset = float((v * norm.bias / norm.weight).sum())
        for h in range(heads):
            boost = float(2 + 6 * torch.rand(1, generator=g))  # logit gain on outliers
            u = torch.randn(hd, generator=g)
            u = u / u.norm()
            q_bias = 3.0
            strength = boost / (attn.scale * q_bias * 0.95 * math.sqrt(d))
            q_rows = slice(h * hd, (h + 1) * hd)
            k_rows = slice(d + h * hd, d + (h + 1) * hd)
            attn.qkv.bias[q_rows] = q_bias * u
            attn.qkv.weight[k_rows] += strength * torch.outer(u, read)
            attn.qkv.bias[k_rows] -= strength * offset * u


def build(name: str, img_size: int = 224, seed: int = 0) -> tuple[nn.Module, GroundTruth]:
    """The planted fixture ``name`` at ``img_size`` px, deterministic in ``seed``, and its truth
    (a :class:`~vitreg.testing.planted_kinds.KindTruth` for the ``kinds_*`` fixtures); the module
    says its weights are planted (``vitreg_weights``), wherever it is wrapped or saved."""
    module, truth = _build(name, img_size, seed)
    module.vitreg_weights = "planted"
    return module, truth


def _build(name: str, img_size: int, seed: int) -> tuple[nn.Module, GroundTruth]:
    from vitreg.testing.planted_hf import HF_FIXTURES, build_hf
    from vitreg.testing.planted_kinds import KINDS, build_kind

    if name in HF_FIXTURES:
        return build_hf(name, img_size=img_size, seed=seed)
    if name in KINDS:
        return build_kind(name, img_size=img_size, seed=seed)
    spec = _spec(name)
    if spec.groups:
        from vitreg.testing.planted_circuits import build_circuit

        return build_circuit(name, spec, img_size, seed)
    module = _create(spec, img_size)
    patch = int(module.patch_embed.patch_size[0])
    rule = FlatRule(patch, THRESHOLD, N_FILTERS, filter_seed=seed)
    # the plan (channels, units, direction) depends on the seed only, not on the image size
    plan = _plan(module, spec, torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        _random_init(module, g)
        _reserve(module, plan, spec.layers[0], rule)
        scales = _calibrate(module, plan, spec, img_size)
        helpers = _plant(module, plan, spec, scales, g)
    module.eval()
    first, second = spec.layers
    cfg = module.pretrained_cfg
    truth = GroundTruth(
        name=name,
        architecture=spec.architecture,
        model_args=dict(img_size=img_size, num_classes=0, **spec.args),
        seed=seed,
        layers=spec.layers,
        units=tuple((layer, u) for layer in spec.layers for u in plan.units[layer]),
        rule=rule,
        first_outlier_layer=first,
        expected_norm_ratio=NORM_RATIO,
        sink_layers=tuple(range(first + 1, len(module.blocks))),
        helper_units=tuple(helpers),
        mean=tuple(float(m) for m in cfg["mean"]),
        std=tuple(float(s) for s in cfg["std"]),
        causal_units=tuple((first, u) for u in plan.units[first]),
        reader_units=tuple((second, u) for u in plan.units[second]),
        emergence_layer=first,
    )
    return module, truth


def build_unplanted(name: str, img_size: int = 224, seed: int = 0) -> nn.Module:
    """The same architecture and realistic random weights as ``build(name)``, with no plant:
    the control on which artifact detectors must find nothing."""
    spec = _spec(name)
    module = _create(spec, img_size)
    with torch.no_grad():
        _random_init(module, torch.Generator().manual_seed(seed + 7919))
    module.vitreg_weights = "random"
    return module.eval()
