"""Planted fixtures with roles: multi-block causes, downstream readers and distractors.

A selection of register neurons must pick the units that *create* the outliers. These fixtures
plant, beside the causes, units that a selection can confuse with them (see ``SPECS`` in
:mod:`vitreg.testing.planted.planted` for the layouts and :class:`GroundTruth` for the roles):

* causes reading the flat flag and writing along the outlier direction ``v``: one block makes
  the outliers, or weak units of several blocks (no outlier mode at their output) and strong ones
  of a later block add up to them. After LayerNorm a flag reader sees the flag divided by the
  token's scale, which earlier writes along ``v`` grow, so it fires harder when they are zeroed:
  later weak units partly make up for a zeroed earlier one (the earlier ones write more, so that
  zeroing any one weak unit lowers the outliers about equally), and the strong units ("flag/v")
  also read the cosine with ``v``, weighted to cancel that to first order (without any weak
  unit they still fire, at a fraction of their strength);
* readers: units of later blocks that read ``v`` after LayerNorm, so they fire only on tokens
  that already are outliers, with large activations (they top a mean-|activation|-on-outliers
  ranking) and writes along ``v`` that reinforce the outliers without creating them;
* distractors: "texture" units firing on every non-flat token (flag off), "cls" units firing
  on [CLS] only (the reference channel is -1 on prefix tokens) and "position" units firing on
  the non-flagged patches at fixed grid positions (a channel of the position embedding, minus the
  flag), all writing a moderate vector orthogonal to ``v``.

The outliers emerge at the first cause group whose target is an outlier mode (``MODE_RATIO``);
cause groups of later blocks keep writing them (amplifiers: they read the flag, not ``v``, so
they are writers wherever they sit). :class:`Options` adds what the plant family
(:mod:`vitreg.testing.planted.plant_family`) varies: a texture threshold or a position rule, extra
write directions ("v1", "v2"), no attention sinks, position-tied distractors.

Each group is calibrated block by block on synthetic images: the calibration tokens are stepped
through the blocks as they are planted, so thresholds and write sizes are set on the inputs the
units really see. ``v`` avoids the reserved channels, which stay free of random writes up to
the last block that reads them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

from vitreg.testing.planted._weights import (
    N_FILTERS,
    THRESHOLD,
    Group,
    PlantPlan,
    Scales,
    Spec,
    create,
    onehot,
    plant_flag,
    plant_sinks,
    random_init,
    reserve,
    set_unit,
    token_layout,
)
from vitreg.testing.planted.truth import FlatRule, GroundTruth, PositionRule

_FLAG_CUT = 0.25  # flag readers fire above this fraction of the flat patches' median flag
_READ_COS = 0.4  # readers fire above this cosine with v after LayerNorm
_CALIB_TOKENS = 512  # calibration patches (2 to 16 synthetic images)
MODE_RATIO = 4.0  # a cause group with this target or more makes the outlier mode (emergence)
_FLAG_OFF = 16.0  # position distractors: flag weight (x their gain) that keeps them off flags


@dataclass(frozen=True)
class Options:
    """What the plant family varies beyond the groups (the defaults build the fixtures as before).

    ``threshold``: the flat rule's texture threshold; ``positions``: a position rule instead (grid
    positions, drawn as ``rule_kind``); ``directions``: outlier write directions (1: ``v``; 2-3
    add "v1", "v2"); ``sinks``: make outliers attention sinks after emergence; ``tied``: grid
    positions of "position" distractors.
    """

    threshold: float = THRESHOLD
    positions: tuple[int, ...] = ()
    rule_kind: str = "positions"
    directions: int = 1
    sinks: bool = True
    tied: tuple[int, ...] = ()


def emergence_layer(groups: tuple[Group, ...]) -> int:
    """The block of the first cause group that makes an outlier mode (target >= MODE_RATIO)."""
    strong = [gr.layer for gr in groups if gr.role == "cause" and gr.target >= MODE_RATIO]
    if not strong:
        raise ValueError(f"no cause group reaches an outlier mode (target >= {MODE_RATIO})")
    return min(strong)


def unit_direction(x: torch.Tensor, reserved: list[int], *others: torch.Tensor) -> torch.Tensor:
    """Unit vector from ``x``: zero on reserved channels, zero mean, orthogonal to ``others``."""
    x = x.clone()
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[reserved] = False
    x[~keep] = 0
    x[keep] -= x[keep].mean()
    for o in others:  # others are unit, zero-mean and zero on reserved channels already
        x -= (x @ o) * o
    return x / x.norm()


def _circuit_plan(
    module: nn.Module, spec: Spec, g: torch.Generator, options: Options
) -> tuple[PlantPlan, list[list[int]]]:
    """Reserved channels, the flag circuit's units, ``v`` (and further directions) and each
    group's units."""
    d = module.embed_dim
    hidden = module.blocks[0].mlp.fc2.in_features
    chans = torch.randperm(d, generator=g)[: 5 + N_FILTERS].tolist()
    counts = {0: 2 * N_FILTERS + 2, 1: 2}
    for gr in spec.groups:
        if gr.layer < 2:
            raise ValueError(f"planted groups start at block 2 (blocks 0-1 hold the flag): {gr}")
        counts[gr.layer] = counts.get(gr.layer, 0) + gr.n
    drawn = {k: torch.randperm(hidden, generator=g)[:n].tolist() for k, n in counts.items()}
    groups = []
    for gr in spec.groups:
        groups.append(sorted(drawn[gr.layer][: gr.n]))
        drawn[gr.layer] = drawn[gr.layer][gr.n :]
    position = chans[4 + N_FILTERS] if options.tied else None
    reserved = chans if options.tied else chans[: 4 + N_FILTERS]
    dirs = [unit_direction(torch.randn(d, generator=g), reserved)]
    for _ in range(options.directions - 1):
        dirs.append(unit_direction(torch.randn(d, generator=g), reserved, *dirs))
    v = dirs[0]
    units = {0: sorted(drawn[0]), 1: sorted(drawn[1])}
    plan = PlantPlan(*chans[:4], chans[4 : 4 + N_FILTERS], units, v, tuple(dirs[1:]), position)
    return plan, groups


@functools.lru_cache(maxsize=16)
def _calibration_images(n: int, size: int) -> torch.Tensor:
    """The synthetic calibration images (made once per count and size: a family of circuits
    reuses them); callers must not write into them."""
    from vitreg.testing.images import synthetic_images

    return synthetic_images(n, size, seed=12345)


def ln_hat(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm without its affine part: every token has norm ``sqrt(d)``."""
    c = x - x.mean(-1, keepdim=True)
    return c * (c.pow(2).mean(-1, keepdim=True) + norm.eps).rsqrt()


def after_attention(blk: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The residual stream after ``blk``'s attention (the MLP's input before norm2)."""
    return h + blk.drop_path1(blk.ls1(blk.attn(blk.norm1(h))))


def after_mlp(blk: nn.Module, mid: torch.Tensor) -> torch.Tensor:
    """The block's output from :func:`after_attention`'s."""
    return mid + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(mid))))


def _bisect(f, target: float, hi: float) -> float:
    """``T >= 0`` with ``f(T) = target`` for increasing ``f`` with ``f(0) < target``."""
    if f(0.0) >= target:
        raise RuntimeError(f"planted calibration: target {target:g} reached without any write")
    for _ in range(60):
        if f(hi) >= target:
            break
        hi *= 2
    else:
        raise RuntimeError(f"planted calibration: target {target:g} not reachable")
    lo = 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return hi


class Planter:
    """Plants the groups of one spec, stepping calibration images through the blocks."""

    def __init__(
        self,
        module: nn.Module,
        spec: Spec,
        plan: PlantPlan,
        units: list[list[int]],
        rule: FlatRule | PositionRule,
        size: int,
        g: torch.Generator,
        sinks: bool = True,
    ) -> None:
        self.module, self.spec, self.plan, self.g = module, spec, plan, g
        self.units = units  # each group's units
        self.rule, self.sinks = rule, sinks
        self.d = module.embed_dim
        cfg = module.pretrained_cfg
        mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
        std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
        n_img = min(max(math.ceil(_CALIB_TOKENS / token_layout(module).n_patches), 2), 16)
        x = (_calibration_images(n_img, size) - mean) / std
        clear = ~rule.ambiguous(x, 0.1).flatten(1)  # clear of the threshold
        selected = rule.mask(x).flatten(1)
        self.flat, self.textured = selected & clear, ~selected & clear
        layout = token_layout(module)
        self.patches, self.cls = layout.patches, layout.cls
        m = module
        if isinstance(rule, PositionRule):  # the flag, 4x the embedded patches' median std
            e = m._pos_embed(m.patch_embed(x))[:, self.patches]
            std = float(e.std(dim=-1).median())
            m.pos_embed[0, -layout.n_patches :][list(rule.positions), plan.flag] = 4.0 * std
        if plan.position is not None:  # patches at the position-tied distractors' positions
            tied = m.pos_embed[0, -layout.n_patches :, plan.position] > 0.5
            self.tied = tied[None].expand_as(self.flat)
        self.h0 = m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(x))))

    # features read by the units, per token, from the LayerNorm hat --------------------------
    def _feature(self, reads: str, hat: torch.Tensor) -> torch.Tensor:
        p = self.plan
        if reads == "flag":
            return hat[..., p.flag] - hat[..., p.zero]
        if reads == "ref":  # prefix tokens: +inv_std; patches: -inv_std
            return hat[..., p.zero] - hat[..., p.ref]
        if reads == "pos":
            return hat[..., p.position] - hat[..., p.zero]
        return hat @ p.direction / math.sqrt(self.d)

    def _reads(
        self, norm: nn.LayerNorm, reads: str, gains: torch.Tensor, cut: float
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Input weights and biases giving ``pre_j = gains_j * (feature - cut)``."""
        p, d = self.plan, self.d
        if reads in ("flag", "ref", "pos"):
            sign = -1.0 if reads == "ref" else 1.0
            ch = {"flag": p.flag, "ref": p.ref, "pos": p.position}[reads]
            w = [onehot(d, (ch, sign * a), (p.zero, -sign * a)) for a in gains.tolist()]
            return w, -gains * cut
        offset = float((p.direction * norm.bias / norm.weight).sum())
        unit = p.direction / norm.weight / math.sqrt(self.d)
        w = [a * unit for a in gains.tolist()]
        return w, -gains * (cut + offset / math.sqrt(self.d))

    def _balance(self, norm: nn.LayerNorm, mid: torch.Tensor, rows: torch.Tensor) -> float:
        """Weight ``c`` of the cosine with ``v`` in ``flag + c cos`` that makes the feature flat,
        to first order, in the size of the tokens' ``v`` component on ``rows``.

        LayerNorm divides the flag by the token's scale, which writes along ``v`` grow: a pure
        flag reader downstream of such writes fires harder when they are zeroed.
        """
        v = self.plan.direction
        eps = 0.01
        less = mid - eps * (mid @ v)[..., None] * v  # each token's v component 1% smaller
        a, b = ln_hat(norm, mid)[rows], ln_hat(norm, less)[rows]
        flag = self._feature("flag", a) - self._feature("flag", b)
        cos = self._feature("v", a) - self._feature("v", b)
        return float(-flag.mean() / cos.mean())

    def _where(self, role: str) -> torch.Tensor:
        """Bool ``[B, T]``: the calibration tokens on which units of ``role`` fire."""
        b, t = self.h0.shape[:2]
        rows = torch.zeros(b, t, dtype=torch.bool)
        if role == "cls":
            rows[:, self.cls] = True
        elif role == "position":
            rows[:, self.patches] = self.textured & self.tied
        else:
            rows[:, self.patches] = self.textured if role == "texture" else self.flat
        return rows

    def _writes(self, gr: Group) -> torch.Tensor:
        """``[n, d]`` unit write directions near the group's direction, times random weights."""
        p, n = self.plan, gr.n
        if gr.writes == "random":
            base = torch.randn(self.d, generator=self.g)
            base = unit_direction(base, p.reserved, p.direction, *p.others)
        elif gr.writes == "v":
            base = p.direction
        else:  # "v1", "v2"
            base = p.others[int(gr.writes[1:]) - 1]
        noise = torch.randn(n, self.d, generator=self.g)
        dirs = torch.stack(
            [unit_direction(base + 0.25 * unit_direction(z, p.reserved), []) for z in noise]
        )
        return dirs * (0.7 + 0.6 * torch.rand(n, generator=self.g))[:, None]

    def group(
        self, blk: nn.Module, mid: torch.Tensor, out: torch.Tensor, gr: Group, units: list[int]
    ) -> torch.Tensor:
        """Plant one group (thresholds and gains from the block's input, write size to target)
        into a block whose output is ``out`` without it; return the output with it."""
        rows = self._where(gr.role)
        hat = ln_hat(blk.norm2, mid)
        if gr.reads == "flag/v":
            c = self._balance(blk.norm2, mid, rows)
            feature = self._feature("flag", hat) + c * self._feature("v", hat)
        else:
            feature = self._feature(gr.reads, hat)
        # texture units are set from the flag's level on the flat patches they must stay off
        med = float(feature[self._where("cause") if gr.role == "texture" else rows].median())
        acts = gr.act * (0.8 + 0.4 * torch.rand(gr.n, generator=self.g))
        if gr.role == "texture":  # fires where the flag is off: pre = act (1 - flag / cut)
            cut = _FLAG_CUT * med
            w_in, b_in = self._reads(blk.norm2, "flag", -acts / cut, 0.0)
            b_in = b_in + acts
        elif gr.role == "position":  # pre = gains (pos - cut) - off * gains * flag / flag level
            flag_med = float(self._feature("flag", hat)[self._where("cause")].median())
            gains = acts / (0.5 * med)
            w_in, b_in = self._reads(blk.norm2, "pos", gains, 0.5 * med)
            w_f, _ = self._reads(blk.norm2, "flag", -_FLAG_OFF * gains / flag_med, 0.0)
            w_in = [a + b for a, b in zip(w_in, w_f, strict=True)]
        elif gr.reads == "flag/v":  # pre = gains (flag + c cos - cut)
            gains = acts / (med * (1 - _FLAG_CUT))
            w_in, b_in = self._reads(blk.norm2, "flag", gains, _FLAG_CUT * med)
            w_v, b_v = self._reads(blk.norm2, "v", c * gains, 0.0)
            w_in = [a + b for a, b in zip(w_in, w_v, strict=True)]
            b_in = b_in + b_v
        else:
            cut = {"flag": _FLAG_CUT * med, "v": _READ_COS, "ref": 0.0}
            gains = acts / (med - cut[gr.reads])
            w_in, b_in = self._reads(blk.norm2, gr.reads, gains, cut[gr.reads])
        dirs = self._writes(gr)
        if gr.equal:  # unit i's write at its median activation acts[i] has the same norm for all
            dirs = dirs / (dirs.norm(dim=1, keepdim=True) * acts[:, None])
        # the units' summed write per token for a unit scale (GLU units have up = 1)
        pre = blk.norm2(mid) @ torch.stack(w_in).T + b_in
        push = blk.mlp.act(pre) @ dirs
        pn = self.patches
        o, q = out[:, pn], push[:, pn]
        n0 = o.norm(dim=-1)
        terms = (n0.square(), 2 * (o * q).sum(-1), q.square().sum(-1))

        def norms(s: float) -> torch.Tensor:  # patch norms after a write of scale ``s``
            return (terms[0] + s * terms[1] + s * s * terms[2]).clamp_min(0).sqrt()

        if gr.role == "cause":

            def ratio(s: float) -> float:
                n = norms(s)
                return float(n[self.flat].median() / n.median())

            scale = _bisect(ratio, gr.target, 1.0)
        elif gr.role == "reader":
            base = float(n0[self.flat].median())
            scale = _bisect(
                lambda s: float(norms(s)[self.flat].median()) / base, 1 + gr.target, 1.0
            )
        else:  # distractors: a write of ``target`` x the median norm of their tokens
            ref = n0.median() if gr.role != "cls" else out[:, self.cls].norm(dim=-1).median()
            scale = float(gr.target * ref / push[rows].norm(dim=-1).median())
        gamma = blk.ls2.gamma.detach() if hasattr(blk.ls2, "gamma") else torch.ones(self.d)
        for i, j in enumerate(units):
            set_unit(blk.mlp, j, w_in[i], float(b_in[i]), scale * dirs[i] / gamma)
        return out + scale * push

    def run(self) -> list[tuple[int, int, str]]:
        """Plant the flag circuit, then every group in block order; return the helper units."""
        blocks, p, groups = self.module.blocks, self.plan, self.spec.groups
        first = min(gr.layer for gr in groups if gr.reads in ("flag", "flag/v"))
        h, inv = self.h0, {}
        for i in range(first + 1):  # LayerNorm scales before planting (as planted._calibrate)
            mid = after_attention(blocks[i], h)
            hat = ln_hat(blocks[i].norm2, mid)[:, self.patches]
            c = mid[:, self.patches] - mid[:, self.patches].mean(-1, keepdim=True)
            inv[i] = float((c.pow(2).mean(-1) + blocks[i].norm2.eps).rsqrt().median())
            if i == 0:
                s0 = float((hat[..., p.ref] - hat[..., p.zero]).median())
            h = after_mlp(blocks[i], mid)
        helpers = []
        if isinstance(self.rule, FlatRule):  # a position rule's flag comes from the embedding
            helpers = plant_flag(self.module, p, Scales(s0, inv[1], inv[first], 0.0))
        self.plant_groups()
        return helpers

    def plant_block(
        self, blk: nn.Module, mid: torch.Tensor, layer: int
    ) -> tuple[torch.Tensor, list[int]]:
        """Plant the groups of block ``layer`` on ``mid`` (the tokens after its attention):
        their units silenced first, causes and readers last; the block's output and the indices
        of the groups planted."""
        groups = self.spec.groups
        here = [k for k, gr in enumerate(groups) if gr.layer == layer]
        for k in here:  # silence the units first: the block's output without any group
            blk.mlp.fc2.weight[:, self.units[k]] = 0
        h = after_mlp(blk, mid)
        for k in sorted(here, key=lambda k: groups[k].role in ("cause", "reader")):
            h = self.group(blk, mid, h, groups[k], self.units[k])
        return h, here

    def plant_groups(self) -> None:
        """Plant every group in block order, calibrating on the tokens as they pass the blocks;
        attention sinks (when asked) in the blocks after emergence."""
        blocks, p, groups = self.module.blocks, self.plan, self.spec.groups
        emergence = emergence_layer(groups)
        h = self.h0
        for i in range(max(gr.layer for gr in groups) + 1):
            blk = blocks[i]
            if i == emergence + 1 and self.sinks:  # later blocks see outliers: attention sinks
                plant_sinks(self.module, p.direction, range(i, len(blocks)), self.g)
            h, _ = self.plant_block(blk, after_attention(blk, h), i)
        if max(gr.layer for gr in groups) <= emergence and self.sinks:
            plant_sinks(self.module, p.direction, range(emergence + 1, len(blocks)), self.g)


def _rule(module: nn.Module, seed: int, options: Options) -> FlatRule | PositionRule:
    """The token rule: texture energy under ``options.threshold``, or fixed grid positions."""
    patch = int(module.patch_embed.patch_size[0])
    if options.positions:
        grid = token_layout(module).grid
        positions = tuple(sorted(options.positions))
        return PositionRule(
            patch_size=patch, grid=grid, positions=positions, kind=options.rule_kind
        )
    return FlatRule(
        patch_size=patch, threshold=options.threshold, n_filters=N_FILTERS, filter_seed=seed
    )


def _embed_tied(module: nn.Module, plan: PlantPlan, tied: tuple[int, ...]) -> None:
    """Position-tied distractors: their channel of the position embedding at 1 on ``tied``."""
    if tied:
        module.pos_embed[0, -token_layout(module).n_patches :][list(tied), plan.position] = 1.0


def build_circuit(
    name: str,
    spec: Spec,
    img_size: int = 224,
    seed: int = 0,
    options: Options | None = None,
) -> tuple[nn.Module, GroundTruth]:
    """A role-annotated planted fixture (``spec.groups``) and its ground truth."""
    options = options or Options()
    module = create(spec, img_size)
    rule = _rule(module, seed, options)
    plan, units = _circuit_plan(module, spec, torch.Generator().manual_seed(seed), options)
    g = torch.Generator().manual_seed(seed + 7919)
    groups = spec.groups
    protect = max(gr.layer for gr in groups if gr.reads in ("flag", "flag/v", "ref", "pos"))
    module.eval()
    with torch.no_grad():
        random_init(module, g)
        reserve(module, plan, protect, rule)
        _embed_tied(module, plan, options.tied)
        planter = Planter(module, spec, plan, units, rule, img_size, g, options.sinks)
        helpers = planter.run()

    def pairs(role: str) -> tuple[tuple[int, int], ...]:
        got = [(gr.layer, us) for gr, us in zip(groups, units, strict=True) if gr.role == role]
        return tuple(sorted((layer, u) for layer, us in got for u in us))

    causal, readers = pairs("cause"), pairs("reader")
    distractors = tuple(
        sorted(
            (gr.layer, u, gr.role)
            for gr, us in zip(groups, units, strict=True)
            if gr.role in ("texture", "cls", "position")
            for u in us
        )
    )
    emergence = emergence_layer(groups)
    causes = [gr for gr in groups if gr.role == "cause"]
    last = max(gr.layer for gr in causes)
    cfg = module.pretrained_cfg
    truth = GroundTruth(
        name=name,
        architecture=spec.architecture,
        model_args=dict(img_size=img_size, num_classes=0, **spec.args),
        seed=seed,
        layers=tuple(sorted({layer for layer, _ in causal + readers})),
        units=causal + readers,
        rule=rule,
        first_outlier_layer=emergence,
        expected_norm_ratio=max(gr.target for gr in causes if gr.layer == emergence),
        sink_layers=tuple(range(emergence + 1, len(module.blocks))) if options.sinks else (),
        helper_units=tuple(helpers),
        mean=tuple(float(m) for m in cfg["mean"]),
        std=tuple(float(s) for s in cfg["std"]),
        causal_units=causal,
        reader_units=readers,
        distractor_units=distractors,
        emergence_layer=emergence,
        target_ratio=max(gr.target for gr in causes if gr.layer == last),
    )
    return module, truth
