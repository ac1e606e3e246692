"""One transformer block's own modules as batch-first functions, and a way to swap the block's
computation for another built from them (what every last-block fix does).

Supported: timm ``VisionTransformer`` blocks (OpenAI/OpenCLIP/SigLIP towers in timm, DINOv2,
DeiT), open_clip ``ResidualAttentionBlock`` towers and HF CLIP / SigLIP encoder layers. The
parts call the source's own modules and weights, so a fix that recombines them is the source
block with the published edit and nothing re-implemented but the edit itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import UnsupportedModelError
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import Handle, HookContext
from vitreg.models.model import Model

Tensor = torch.Tensor
QKV = Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]
Compute = Callable[[Tensor, TokenLayout], Tensor]


@dataclass
class BlockParts:
    """Block ``layer``'s pieces on ``[B, N, C]`` tensors; q/k/v come as ``[B, H, N, D]``."""

    module: nn.Module
    ln1: Callable[[Tensor], Tensor]
    qkv: QKV
    attn_out: Callable[[Tensor], Tensor]  # [B, N, C] head outputs -> residual update (proj, scale)
    ln2: Callable[[Tensor], Tensor]
    mlp: Callable[[Tensor], Tensor]  # residual update of the MLP branch (LayerScale included)
    n_heads: int
    scale: float
    seq_first: bool = False  # the block takes and returns [N, B, C] (older open_clip)
    returns_tuple: bool = False  # the block returns (hidden_states,) (transformers v4)

    def attention(self, x: Tensor) -> Tensor:
        """The block's own attention update ``attn_out(softmax(q k^T s) v)`` of ``ln1(x)``."""
        q, k, v = self.qkv(self.ln1(x))
        return self.attn_out(mix(torch.softmax((q * self.scale) @ k.transpose(-2, -1), -1), v))


def mix(weights: Tensor, v: Tensor) -> Tensor:
    """``weights @ v`` for ``[B, H, N, N]`` and ``[B, H, N, D]``, heads merged to ``[B, N, H*D]``."""
    out = weights @ v
    return out.transpose(1, 2).flatten(2)


def _heads(x: Tensor, n_heads: int) -> Tensor:
    return x.unflatten(-1, (n_heads, -1)).transpose(1, 2)


def _timm(blk: nn.Module) -> BlockParts:
    attn = blk.attn
    h = int(attn.num_heads)

    def qkv(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = attn.qkv(x).unflatten(-1, (3, h, -1)).permute(2, 0, 3, 1, 4).unbind(0)
        return attn.q_norm(q), attn.k_norm(k), v

    norm = getattr(attn, "norm", nn.Identity())  # timm's optional scale_norm before proj
    return BlockParts(
        blk,
        blk.norm1,
        qkv,
        lambda o: blk.ls1(attn.proj_drop(attn.proj(norm(o)))),
        blk.norm2,
        lambda x: blk.ls2(blk.mlp(x)),
        h,
        float(attn.scale),
    )


def _open_clip(blk: nn.Module, seq_first: bool) -> BlockParts:
    attn = blk.attn
    h = int(attn.num_heads)

    def qkv(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
        return _heads(q, h), _heads(k, h), _heads(v, h)

    ln_attn = getattr(blk, "ln_attn", nn.Identity())  # scale_attn towers normalise the heads
    return BlockParts(
        blk,
        blk.ln_1,
        qkv,
        lambda o: blk.ls_1(attn.out_proj(ln_attn(o))),
        blk.ln_2,
        lambda x: blk.ls_2(blk.mlp(x)),
        h,
        float(attn.head_dim) ** -0.5,
        seq_first=seq_first,
    )


def _hf(layer: nn.Module) -> BlockParts:
    attn = layer.self_attn
    h = int(attn.num_heads)

    def qkv(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return _heads(attn.q_proj(x), h), _heads(attn.k_proj(x), h), _heads(attn.v_proj(x), h)

    ret = inspect.signature(type(layer).forward).return_annotation
    return BlockParts(
        layer,
        layer.layer_norm1,
        qkv,
        attn.out_proj,
        layer.layer_norm2,
        layer.mlp,
        h,
        float(attn.scale),
        returns_tuple=ret is not torch.Tensor and "Tensor]" in str(ret),
    )


def block_parts(model: Model, layer: int) -> BlockParts:
    """The parts of block ``layer`` of ``model``, or :class:`UnsupportedModelError` saying why."""
    family = model.family
    adapter = model.adapter
    if family == "timm-vit":
        blk = adapter.blocks[layer]
        if type(blk).__name__ != "Block":
            raise UnsupportedModelError(
                f"block {layer} is timm's {type(blk).__name__}, not the pre-norm Block these "
                "fixes are defined on (post-norm and parallel blocks order norm and residual "
                "differently)"
            )
        return _timm(blk)
    if family == "open_clip-vit":
        return _open_clip(adapter.blocks[layer], adapter.seq_first)
    if family in ("hf-clip", "hf-siglip"):
        return _hf(adapter.layers[layer])
    raise UnsupportedModelError(
        f"{family} models: last-block fixes are defined on plain pre-norm ViT blocks with one "
        "global attention (timm ViT, open_clip, HF CLIP/SigLIP towers); "
        + (
            "this family attends in windows or stages, so the block has no global q/k to recombine"
            if adapter.hierarchical
            else "this family's blocks (rotary positions or another block layout) are not wired"
        )
    )


def replace_block(model: Model, layer: int, compute: Compute) -> Handle:
    """Run ``compute(x, layout)`` instead of block ``layer`` (``x``: its batch-first input)
    until the handle is removed. The block's own forward is skipped, so its inner hook sites
    stay silent; ``hook_resid_pre`` and ``hook_resid_post`` still fire."""
    parts = block_parts(model, layer)
    blk = parts.module
    seen: dict[str, object] = {}

    def grab(t: Tensor, hook: HookContext) -> None:
        seen["x"], seen["layout"] = t, hook.layout

    def forward(*_args: object, **_kwargs: object) -> object:
        out = compute(seen.pop("x"), seen.pop("layout"))
        if parts.seq_first:
            out = out.transpose(0, 1)
        return (out,) if parts.returns_tuple else out

    handle = model.hooks([(hook_name(layer, "hook_resid_pre"), grab)])
    blk.forward = forward
    handle.add(lambda: delattr(blk, "forward"))
    return handle
