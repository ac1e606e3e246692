"""Plumbing shared by the planted fixtures (timm-style private module): specs, seeded
trained-like initialisation, reserved channels and the weight edits that plant units.

The names are public so that the fixture builders (:mod:`.planted`, :mod:`.planted_circuits`,
:mod:`.planted_kinds`, :mod:`.plant_family`) share them; the module is private, not API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.models.input_size import check_built_size
from vitreg.testing.planted.truth import FlatRule, PositionRule


@dataclass(frozen=True)
class Group:
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
class Spec:
    """A fixture's timm architecture, its planted layers and unit counts (or role groups)."""

    architecture: str
    description: str
    layers: tuple[int, ...]
    n_units: tuple[int, ...]
    args: dict = field(default_factory=dict)
    groups: tuple[Group, ...] = ()  # role-annotated fixtures: built by planted_circuits


N_FILTERS = 16
THRESHOLD = 0.05  # mean |filter response| of a preprocessed patch; ~ pixel std 0.06
NORM_RATIO = 40.0  # target median outlier norm / median patch norm at the first planted layer
TERM = 20.0  # |abs-unit input| per filter at the threshold: keeps GELU/SiLU near |x|
KAPPA = 0.25  # energy channel after LayerNorm per unit of (energy / threshold - 1)
STEP = 40.0  # slope of the flat-flag ramp in units of (energy / threshold)
RAMP = 6.0  # height of that ramp (pre-activation units)
FLAG = 4.0  # flat flag after LayerNorm at the first planted layer
FLAG_T = 1.0  # planted units fire above this flag value


def create(spec: Spec, img_size: int) -> nn.Module:
    """The timm architecture with uninitialised parameters, built fast on the meta device."""
    import timm

    args = dict(img_size=img_size, num_classes=0, **spec.args)
    module = timm.create_model(spec.architecture, pretrained=False, device="meta", **args)
    check_built_size(module, f"the planted {spec.architecture}")  # before it is calibrated
    return module.to_empty(device="cpu")


def token_layout(module: nn.Module) -> TokenLayout:
    """The token layout of a planted timm ViT, read off its own attributes."""
    pe = module.patch_embed
    n_cls = 1 if getattr(module, "cls_token", None) is not None else 0
    grid = tuple(int(s) for s in pe.grid_size)
    return TokenLayout(n_cls, int(module.num_reg_tokens), grid, tuple(pe.patch_size))


class Init:
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


def random_init(module: nn.Module, g: torch.Generator) -> None:
    """Seeded weights with trained-like scales (LayerScale ~0.1-0.5, [CLS]/registers O(1))."""
    init = Init(g)
    d = module.embed_dim
    layout = token_layout(module)
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
class PlantPlan:
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


def reserve(
    module: nn.Module, plan: PlantPlan, protect: int, rule: FlatRule | PositionRule
) -> None:
    """Embed texture filters and the constant reference; keep random writes off reserved channels
    in blocks ``0..protect``."""
    res = plan.reserved
    layout = token_layout(module)
    pe = module.patch_embed.proj
    pe.weight[res] = 0
    if isinstance(rule, FlatRule):
        pe.weight[plan.texture] = rule.filters() * gain_texture(rule.threshold)
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


def gain_texture(threshold: float = THRESHOLD) -> float:
    """Embedding gain of the texture filters: 0.1 per channel at the threshold."""
    return 0.1 / threshold


@dataclass
class Scales:
    """LayerNorm scales and the median patch norm measured before planting."""

    s0: float  # LayerNorm-hat per raw embedding unit at block 0's MLP
    s1: float  # ... per raw residual unit at block 1's MLP
    s_plant: float  # ... at the first planted layer's MLP
    median_norm: float  # median patch norm after the first planted layer


def set_unit(mlp: nn.Module, j: int, w_in: torch.Tensor, b_in: float, w_out: torch.Tensor) -> None:
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


def onehot(d: int, *pairs: tuple[int, float]) -> torch.Tensor:
    """A length-``d`` vector with ``value`` added at each ``(index, value)`` pair."""
    v = torch.zeros(d)
    for i, val in pairs:
        v[i] += val
    return v


def plant_flag(module: nn.Module, plan: PlantPlan, sc: Scales) -> list[tuple[int, int, str]]:
    """Blocks 0-1: the texture-energy channel and the flat flag (no random numbers drawn)."""
    d = module.embed_dim
    blocks = module.blocks
    z, k = plan.zero, N_FILTERS
    helpers: list[tuple[int, int, str]] = []
    # block 0: energy = c_e * (sum_k |G y_k| - lam * G_r r), all over the same LayerNorm scale
    gain = TERM / (gain_texture() * THRESHOLD * sc.s0)
    gain_ref = 1.0 / sc.s0
    lam = k * TERM
    c_e = KAPPA / (k * TERM * sc.s1)
    u0 = plan.units[0]
    for i, ch in enumerate(plan.texture):
        for s, j in ((1, u0[2 * i]), (-1, u0[2 * i + 1])):
            set_unit(
                blocks[0].mlp,
                j,
                onehot(d, (ch, s * gain), (z, -s * gain)),
                0.0,
                onehot(d, (plan.energy, c_e)),
            )
            helpers.append((0, j, "texture energy"))
    for s, j in ((1, u0[-2]), (-1, u0[-1])):
        w_in = onehot(d, (plan.ref, s * gain_ref), (z, -s * gain_ref))
        set_unit(blocks[0].mlp, j, w_in, 0.0, onehot(d, (plan.energy, -s * c_e * lam)))
        helpers.append((0, j, "energy reference"))
    # block 1: flag = c_f * clamp(a (1 - energy/threshold) + h/2, 0, h) via two ramps
    a1 = STEP / KAPPA
    c_f = FLAG / (RAMP * sc.s_plant)
    ramps = zip((1, -1), plan.units[1], (RAMP / 2, -RAMP / 2), strict=True)
    for s, j, b in ramps:
        w_in = onehot(d, (plan.energy, -a1), (z, a1))
        set_unit(blocks[1].mlp, j, w_in, b, onehot(d, (plan.flag, s * c_f)))
        helpers.append((1, j, "flat flag"))
    return helpers


def plant_sinks(module: nn.Module, v: torch.Tensor, layers: range, g: torch.Generator) -> None:
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
