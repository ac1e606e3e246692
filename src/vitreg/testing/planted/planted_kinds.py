"""Planted fixtures for each kind of token artifact beside high-norm outliers.

Tiny timm DINOv2-style ViTs (64 wide, 6 blocks, 4 heads, 8-px patches, LayerScale) with seeded
trained-like random weights (:func:`vitreg.testing.planted._weights.random_init`) and one planted kind:

* ``kinds_nop_sink``: one head whose every query attends to [CLS], whose value there is ~0
  (a NOP-like sink, Fesser et al. 2026);
* ``kinds_broadcast_sink``: one head whose every query attends to [CLS], whose value there is
  large, so the head writes one vector into every token (a broadcast-like sink);
* ``kinds_position``: a large position embedding at fixed patches (the four corners and the
  top-left 2x2), along one channel (SigLIP's edge patches, openpi #947; dinov2 #419);
* ``kinds_massive``: an MLP unit of one block writes a value ~1000x the median activation into
  one channel of [CLS] (a massive activation, Sun et al. 2024);
* ``kinds_registers``: 4 registers carrying high norms and serving as NOP sinks in two blocks,
  with clean patches (trained-style registers that absorbed the artifacts);
* ``kinds_graded_sinks``: three heads whose every query gives [CLS] the logit 3, 6 and 10 over
  the other keys (~0, since [CLS]'s key channel holds :data:`GRADED_MARK`, which makes its
  LayerNorm output ``sqrt(D - 1)`` to 0.1%): concentration ratios ~e^3, e^6, e^10 and attention
  on [CLS] ~0.24 (no event), ~0.86 (an event by the relaxed rule and Definition 1 for eps >= 0.2,
  not 0.1) and ~0.997 (every rule);
* ``kinds_clean`` / ``kinds_clean_reg4``: the same weights with nothing planted.

Each plant uses reserved residual channels that no block writes into, so what it puts there
stays exact in every block; :class:`KindTruth` says what was planted and where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitreg.errors import SpecError
from vitreg.testing.planted._weights import Spec, create, random_init
from vitreg.testing.planted.truth import TruthModel

ARGS = dict(embed_dim=64, depth=6, num_heads=4, patch_size=8)
IMG_SIZE = 64  # 8 x 8 patches
POSITION_PATCHES = ((0, 0), (0, 1), (1, 0), (1, 1), (0, -1), (-1, 0), (-1, -1))
KEY_LOGIT = 14.0  # sink key logit over the other keys (attention ~0.9999 on the sink)
CLS_MARK = 30.0  # reserved [CLS] channel value
PATCH_MARK = 6.0  # reserved patch channel value (the NOP head's values read it)
POSITION_VALUE = 40.0  # planted position-embedding entry (~5x the median patch norm)
MASSIVE_VALUE = 1000.0  # planted massive activation (~3000x the median |activation|)
REGISTER_MARK = 20.0  # reserved register channel value (~3x the median patch norm)
GRADED_MARK = 1000.0  # [CLS] key channel of the graded plant: its LayerNorm output ~sqrt(D - 1)
GRADED = ((1, 0, 3.0), (3, 1, 6.0), (5, 2, 10.0))  # (block, head, [CLS] logit over the others)


class PlantedSink(TruthModel):
    """A planted sink head: ``block``, ``head``, class ("nop"/"broadcast") and key token."""

    block: int
    head: int
    kind: str
    key_type: str  # "cls" | "register" | "patch"
    key_index: int  # index within its token type


class KindTruth(TruthModel):
    """What a kinds fixture plants; empty fields mean "none of this kind".

    ``massive``: ``(first_block, token_type, token_index, channel)``; ``positions``: the
    row-major patch indices with a planted position embedding (along ``position_channel``);
    ``registers_absorb``: the registers carry the high norms and the sinks, patches are clean.
    """

    name: str
    architecture: str
    model_args: dict[str, Any]
    seed: int
    description: str
    sinks: tuple[PlantedSink, ...] = ()
    logits: tuple[tuple[int, int, float], ...] = ()  # (block, head, planted [CLS] logit)
    massive: tuple[tuple[int, str, int, int], ...] = ()
    positions: tuple[int, ...] = ()
    position_channel: int | None = None
    registers_absorb: bool = False
    reserved: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Kind:
    architecture: str
    description: str


KINDS: dict[str, _Kind] = {
    "kinds_clean": _Kind("vit_small_patch14_dinov2", "tiny DINOv2-style ViT, nothing planted"),
    "kinds_clean_reg4": _Kind(
        "vit_small_patch14_reg4_dinov2", "tiny DINOv2-style ViT with 4 registers, nothing planted"
    ),
    "kinds_nop_sink": _Kind(
        "vit_small_patch14_dinov2", "tiny ViT: block 2 head 1 is a NOP-like sink on [CLS]"
    ),
    "kinds_broadcast_sink": _Kind(
        "vit_small_patch14_dinov2", "tiny ViT: block 3 head 2 is a broadcast-like sink on [CLS]"
    ),
    "kinds_position": _Kind(
        "vit_small_patch14_dinov2",
        "tiny ViT: large position embedding at the corner and top-left patches (one channel)",
    ),
    "kinds_massive": _Kind(
        "vit_small_patch14_dinov2",
        "tiny ViT: a block-2 MLP unit writes a massive activation into one [CLS] channel",
    ),
    "kinds_registers": _Kind(
        "vit_small_patch14_reg4_dinov2",
        "tiny ViT with 4 registers that carry the high norms and NOP sinks (blocks 2, 4)",
    ),
    "kinds_graded_sinks": _Kind(
        "vit_small_patch14_dinov2",
        "tiny ViT: heads 1.0, 3.1, 5.2 give [CLS] the logits 3, 6, 10 (graded sinks)",
    ),
}


def _base(name: str, img_size: int, seed: int) -> tuple[nn.Module, torch.Generator]:
    """The fixture's architecture with seeded trained-like random weights."""
    spec = Spec(KINDS[name].architecture, KINDS[name].description, (), (), dict(ARGS))
    module = create(spec, img_size)
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        random_init(module, g)
    return module, g


def _reserve(module: nn.Module, channels: list[int]) -> None:
    """No embedding, token or block writes into ``channels`` and no block reads them (the
    plants add their own readers); pre-norm biases there are 0."""
    pe = module.patch_embed.proj
    pe.weight[channels] = 0.0
    if pe.bias is not None:
        pe.bias[channels] = 0.0
    module.pos_embed[..., channels] = 0.0
    for tok in (module.cls_token, module.reg_token):
        if tok is not None:
            tok[..., channels] = 0.0
    for blk in module.blocks:
        for lin in (blk.attn.proj, blk.mlp.fc2):
            lin.weight[channels] = 0.0
            lin.bias[channels] = 0.0
        for lin in (blk.attn.qkv, blk.mlp.fc1):
            lin.weight[:, channels] = 0.0
        for norm in (blk.norm1, blk.norm2):
            norm.bias[channels] = 0.0


def _patch_positions(module: nn.Module) -> slice:
    """The rows of ``pos_embed`` that belong to patches."""
    n = module.patch_embed.num_patches
    return slice(module.pos_embed.shape[1] - n, module.pos_embed.shape[1])


def _sink_head(
    module: nn.Module,
    block: int,
    head: int,
    key: int,
    value: int,
    g: torch.Generator,
    logit: float = KEY_LOGIT,
    ln_out: float = 7.0,
):
    """Make ``head`` of ``block`` attend from every query to the token marked in channel
    ``key`` (with ``logit`` when the marked token's LayerNorm output there is ``ln_out``); its
    values read channel ``value`` only (constant query, rank-1 key and value)."""
    blk = module.blocks[block]
    attn = blk.attn
    d, hd = module.embed_dim, module.embed_dim // attn.num_heads
    u = torch.randn(hd, generator=g)
    u = u / u.norm()
    q_rows = slice(head * hd, (head + 1) * hd)
    k_rows = slice(d + head * hd, d + (head + 1) * hd)
    v_rows = slice(2 * d + head * hd, 2 * d + (head + 1) * hd)
    mark = float(blk.norm1.weight[key]) * ln_out  # ~ LayerNorm output of the marked token
    attn.qkv.weight[q_rows] = 0.0
    attn.qkv.bias[q_rows] = 4.0 * u
    attn.qkv.weight[k_rows] = 0.0
    attn.qkv.weight[k_rows, key] = u * logit / (attn.scale * 4.0 * mark)
    attn.qkv.bias[k_rows] = 0.0
    v_dir = torch.randn(hd, generator=g)
    attn.qkv.weight[v_rows] = 0.0
    attn.qkv.weight[v_rows, value] = v_dir / v_dir.norm()
    attn.qkv.bias[v_rows] = 0.0


def build_kind(name: str, img_size: int = IMG_SIZE, seed: int = 0) -> tuple[nn.Module, KindTruth]:
    """The kinds fixture ``name`` at ``img_size`` px (8-px patches) and what it plants."""
    if name not in KINDS:
        raise SpecError(f"unknown planted kinds fixture {name!r}; known: {sorted(KINDS)}")
    module, g = _base(name, img_size, seed)
    d = module.embed_dim
    order = torch.randperm(d, generator=torch.Generator().manual_seed(seed)).tolist()
    c_cls, c_patch, c_pos, c_mass, c_reg, c_key = order[:6]
    reserved = [c_cls, c_patch, c_pos, c_mass, c_reg, c_key]
    truth: dict[str, Any] = {}
    with torch.no_grad():
        if name not in ("kinds_clean", "kinds_clean_reg4"):
            _reserve(module, reserved)
            module.cls_token[..., c_cls] = CLS_MARK
            module.pos_embed[:, _patch_positions(module), c_patch] = PATCH_MARK
        if name == "kinds_nop_sink":
            _sink_head(module, 2, 1, c_cls, c_patch, g)
            truth["sinks"] = (_sink(2, 1, "nop", "cls"),)
        elif name == "kinds_broadcast_sink":
            _sink_head(module, 3, 2, c_cls, c_cls, g)
            truth["sinks"] = (_sink(3, 2, "broadcast", "cls"),)
        elif name == "kinds_position":
            h, w = module.patch_embed.grid_size
            cells = sorted({(r % h) * w + (c % w) for r, c in POSITION_PATCHES})
            rows = _patch_positions(module).start + torch.tensor(cells)
            module.pos_embed[0, rows, c_pos] = POSITION_VALUE
            truth.update(positions=tuple(cells), position_channel=c_pos)
        elif name == "kinds_massive":
            _massive_unit(module, 2, c_cls, c_mass)
            truth["massive"] = ((2, "cls", 0, c_mass),)
        elif name == "kinds_registers":
            module.reg_token[..., c_reg] = REGISTER_MARK
            module.reg_token[0, 0, c_key] = REGISTER_MARK
            for block in (2, 4):
                _sink_head(module, block, 0, c_key, c_patch, g)
            truth.update(
                sinks=tuple(_sink(b, 0, "nop", "register") for b in (2, 4)),
                registers_absorb=True,
            )
        elif name == "kinds_graded_sinks":
            module.cls_token[..., c_key] = GRADED_MARK
            for block, head, logit in GRADED:
                _sink_head(module, block, head, c_key, c_patch, g, logit, (d - 1) ** 0.5)
            events = [(b, h) for b, h, logit in GRADED if logit > 4.0]
            truth.update(sinks=tuple(_sink(b, h, "nop", "cls") for b, h in events), logits=GRADED)
    module.eval()
    return module, KindTruth(
        name=name,
        architecture=KINDS[name].architecture,
        model_args=dict(img_size=img_size, num_classes=0, **ARGS),
        seed=seed,
        description=KINDS[name].description,
        reserved=tuple(reserved) if name not in ("kinds_clean", "kinds_clean_reg4") else (),
        **truth,
    )


def _sink(block: int, head: int, kind: str, key_type: str) -> PlantedSink:
    """A planted sink head whose key is the first token of ``key_type``."""
    return PlantedSink(block=block, head=head, kind=kind, key_type=key_type, key_index=0)


def _massive_unit(module: nn.Module, block: int, read: int, write: int) -> None:
    """One MLP unit of ``block`` fires on the token marked in channel ``read`` ([CLS]) and
    writes :data:`MASSIVE_VALUE` into channel ``write`` of it."""
    blk = module.blocks[block]
    fc1, fc2 = blk.mlp.fc1, blk.mlp.fc2
    mark = float(blk.norm2.weight[read]) * 7.0
    fc1.weight[0] = 0.0
    fc1.weight[0, read] = 10.0 / mark
    fc1.bias[0] = -5.0  # ~5 on [CLS], ~-5 (GELU ~ -1e-6) on every other token
    act = 5.0
    fc2.weight[:, 0] = 0.0  # layout: hidden unit 0's output column, not a token
    fc2.weight[write, 0] = MASSIVE_VALUE / (act * float(blk.ls2.gamma[write]))
