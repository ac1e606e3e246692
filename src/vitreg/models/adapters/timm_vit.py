"""Adapter for timm ``VisionTransformer``: DINOv2 (+reg, SwiGLU), CLIP, SigLIP, DeiT-III, DINO, ViT."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.hooks.attention import PatternSite, capture_qk
from vitreg.hooks.sites import (
    Handle,
    InputSite,
    OutputSite,
    Site,
    bhnd_to_bnhd,
    bnhd_to_bhnd,
)
from vitreg.hooks.streamed import StreamedPattern
from vitreg.models.adapters.base import EXACT, Adapter, Family, ValuesFn, register_adapter

_ATTN_PARTS = ("qkv", "q_norm", "k_norm", "attn_drop", "scale", "num_heads")
_BLOCK_PARTS = ("norm1", "attn", "norm2", "mlp")


def _has(obj: Any, names: tuple[str, ...]) -> bool:
    return all(hasattr(obj, n) for n in names)


def qkv_part(index: int, n_heads: int):
    """(to_canon, from_canon) for q (0), k (1) or v (2) of a fused qkv Linear output ``[B, N, H, D]``."""

    def to_canon(out: torch.Tensor) -> torch.Tensor:
        b, n, _ = out.shape
        return out.reshape(b, n, 3, n_heads, -1)[:, :, index]

    def from_canon(new: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        b, n, _ = out.shape
        parts = list(out.reshape(b, n, 3, n_heads, -1).unbind(2))
        parts[index] = new
        return torch.stack(parts, dim=2).reshape(b, n, -1)

    return to_canon, from_canon


def image_grid(
    image_size: tuple[int, int],
    patch_size: tuple[int, int],
    built_size: tuple[int, int] | None,
    dynamic: bool,
    pad: bool,
    hint: str,
) -> tuple[int, int]:
    """Patch grid of a plain ViT at ``image_size``, or an :class:`InputError` saying what fits."""
    h, w = image_size
    ph, pw = patch_size
    if not dynamic and built_size is not None and (h, w) != tuple(built_size):
        raise InputError(
            f"this model takes {built_size[0]}x{built_size[1]} images, got {h}x{w}. "
            f"Resize with model.transform, or {hint}"
        )
    if pad:
        return -(-h // ph), -(-w // pw)
    if h % ph or w % pw:
        raise InputError(
            f"image size {h}x{w} is not a multiple of the patch size {ph}x{pw}; "
            "resize or crop to a multiple (model.transform does)"
        )
    return h // ph, w // pw


@register_adapter(EXACT)
class TimmViTAdapter(Adapter):
    """timm ``VisionTransformer`` with ``Block``-style blocks (pre-norm, fused or plain attention)."""

    family = "timm-vit"
    source = "timm"

    families = (
        Family(
            "dinov2",
            "DINOv2 (+reg4)",
            "timm",
            (
                "timm:vit_small_patch14_dinov2.lvd142m",
                "timm:vit_small_patch14_reg4_dinov2.lvd142m",
            ),
            (
                "Defaults to 518x518 inputs (37x37 patches) with a strict size check; pass "
                "img_size=224 or dynamic_img_size=True to vitreg.load for other sizes.",
                "reg4 models have 4 trained registers after [CLS], with no positional embedding.",
                "LayerScale (ls1/ls2). The giant model uses a packed SwiGLU MLP: mlp.hook_post is "
                "the gated product, not the SiLU gate.",
            ),
        ),
        Family(
            "clip",
            "CLIP in timm",
            "timm",
            ("timm:vit_base_patch16_clip_quickgelu_224.openai",),
            (
                "Untagged CLIP names load fine-tuned ImageNet classifiers "
                "(e.g. .laion2b_ft_in12k_in1k); always name the tag (.openai, .laion2b, ...).",
                "OpenAI weights were trained with QuickGELU: use the *_clip_quickgelu_* names, the "
                "plain names build nn.GELU.",
                "Pre-norm (norm_pre = ln_pre), no LayerScale; the head is the CLIP projection. "
                "Mean/std differ per tag: use model.transform.",
            ),
        ),
        Family(
            "siglip",
            "SigLIP",
            "timm",
            ("timm:vit_base_patch16_siglip_224.webli",),
            (
                "No [CLS] token: the layout has no prefix, every token is a patch.",
                "Pools with a MAP head (attention-pool latent) whose attention is not a block hook; "
                "*_siglip_gap_* variants average instead.",
                "Mean/std 0.5.",
            ),
        ),
        Family(
            "deit3",
            "DeiT-III",
            "timm",
            ("timm:deit3_small_patch16_224.fb_in1k",),
            (
                "Supervised ImageNet training; LayerScale (init 1e-6); [CLS] gets no positional "
                "embedding (no_embed_class).",
            ),
        ),
        Family(
            "dino",
            "DINO (v1)",
            "timm",
            ("timm:vit_small_patch16_224.dino",),
            (
                "Plain ViT without LayerScale; the untagged name loads supervised augreg weights, "
                "not DINO: keep the .dino tag.",
            ),
        ),
        Family(
            "planted",
            "planted (synthetic)",
            "timm",
            ("planted:dinov2_s14",),
            (
                "Synthetic: a real timm architecture with random weights and planted register "
                "neurons, with the ground truth. For offline demos and tests, not for claims about "
                "pretrained models.",
            ),
        ),
    )

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        try:
            from timm.models.vision_transformer import VisionTransformer
        except ImportError:  # pragma: no cover - timm is a core dependency
            return False
        if not isinstance(module, VisionTransformer):
            return False
        return all(
            _has(b, _BLOCK_PARTS) and _has(b.attn, _ATTN_PARTS) and hasattr(b.mlp, "drop1")
            for b in module.blocks
        )

    # structure ----------------------------------------------------------------------
    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.module.blocks)

    @property
    def n_layers(self) -> int:
        return len(self.module.blocks)

    @property
    def d_model(self) -> int:
        return int(self.module.embed_dim)

    @property
    def d_mlp(self) -> int:
        return int(self.module.blocks[0].mlp.fc2.in_features)

    @property
    def n_heads(self) -> int:
        return int(self.module.blocks[0].attn.num_heads)

    def base_layout(self) -> TokenLayout:
        m = self.module
        n_cls = 1 if getattr(m, "cls_token", None) is not None else 0
        n_reg = int(getattr(m, "num_reg_tokens", 0) or 0)
        grid = tuple(int(g) for g in m.patch_embed.grid_size)
        return TokenLayout(n_cls, n_reg, grid, tuple(m.patch_embed.patch_size))

    def default_image_size(self) -> tuple[int, int]:
        return tuple(int(s) for s in self.module.patch_embed.img_size)

    def grid_for(self, image_size: tuple[int, int]) -> tuple[int, int]:
        pe = self.module.patch_embed
        dynamic = bool(getattr(self.module, "dynamic_img_size", False)) or not pe.strict_img_size
        hint = "load it with img_size=(H, W) or dynamic_img_size=True (vitreg.load(spec, img_size=224))"
        return image_grid(
            image_size, pe.patch_size, pe.img_size, dynamic, bool(pe.dynamic_img_pad), hint
        )

    def input_module(self) -> nn.Module:
        return self.module.patch_embed

    def attention_path(self) -> str:
        fused = any(getattr(b.attn, "fused_attn", False) for b in self.module.blocks)
        if fused:
            return "fused SDPA; hook_pattern recomputed from q/k (attention='native' unfuses)"
        return "unfused; hook_pattern read natively from attn.attn_drop"

    # hooks -----------------------------------------------------------------------------
    def build_sites(self) -> dict[str, Site]:
        m = self.module
        sites: dict[str, Site] = {
            "hook_tokens": InputSite("hook_tokens", None, module=m.blocks[0], kwarg="x"),
        }
        for i, blk in enumerate(m.blocks):
            p = f"blocks.{i}"
            attn = blk.attn
            v_to, v_from = qkv_part(2, attn.num_heads)

            def compute(q: torch.Tensor, k: torch.Tensor, kw: dict, attn: nn.Module = attn):
                mask, causal = kw.get("attn_mask"), kw.get("is_causal", False)
                if hasattr(attn, "recompute_pattern"):  # extra key slot (vitreg.arch attn_bias)
                    return attn.recompute_pattern(q, k, mask, causal)
                return StreamedPattern(q, k, attn.scale, mask, causal)

            sites.update(
                {
                    f"{p}.hook_resid_pre": InputSite(
                        f"{p}.hook_resid_pre", i, module=blk, kwarg="x"
                    ),
                    f"{p}.ln1.hook_in": InputSite(f"{p}.ln1.hook_in", i, module=blk.norm1),
                    f"{p}.ln1.hook_out": OutputSite(f"{p}.ln1.hook_out", i, module=blk.norm1),
                    f"{p}.attn.hook_q": OutputSite(
                        f"{p}.attn.hook_q",
                        i,
                        module=attn.q_norm,
                        to_canon=bhnd_to_bnhd,
                        from_canon=bnhd_to_bhnd,
                    ),
                    f"{p}.attn.hook_k": OutputSite(
                        f"{p}.attn.hook_k",
                        i,
                        module=attn.k_norm,
                        to_canon=bhnd_to_bnhd,
                        from_canon=bnhd_to_bhnd,
                    ),
                    f"{p}.attn.hook_v": OutputSite(
                        f"{p}.attn.hook_v", i, module=attn.qkv, to_canon=v_to, from_canon=v_from
                    ),
                    f"{p}.attn.hook_pattern": PatternSite(
                        f"{p}.attn.hook_pattern",
                        i,
                        attn=attn,
                        native_module=attn.attn_drop,
                        capture=capture_qk(attn, attn.q_norm, attn.k_norm, compute),
                    ),
                    f"{p}.hook_resid_mid": InputSite(f"{p}.hook_resid_mid", i, module=blk.norm2),
                    f"{p}.ln2.hook_out": OutputSite(f"{p}.ln2.hook_out", i, module=blk.norm2),
                    f"{p}.mlp.hook_post": OutputSite(f"{p}.mlp.hook_post", i, module=blk.mlp.drop1),
                    f"{p}.hook_resid_post": OutputSite(f"{p}.hook_resid_post", i, module=blk),
                }
            )
        sites["ln_final.hook_out"] = OutputSite("ln_final.hook_out", None, module=m.norm)
        return sites

    # running -----------------------------------------------------------------------------
    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.module.forward_features(x)

    def insert_tokens(self, k: int, values_fn: ValuesFn) -> Handle:
        """Insert ``k`` tokens after [CLS] + registers at ``norm_pre``'s input (before the pre-norm).

        That is where trained registers enter and where the official test-time-registers code
        appends its token (before ``ln_pre``): on CLIP-style models a zero token reaches block 0
        as ``norm_pre(0)``. ``norm_pre`` is Identity for DINOv2, SigLIP and DeiT.
        """
        return insert_after_prefix(self.module, k, values_fn, attn_modules=[])

    def data_config(self) -> dict:
        from timm.data import resolve_model_data_config

        cfg = resolve_model_data_config(self.module)
        cfg["input_size"] = (3, *self.default_image_size())
        return cfg


def insert_after_prefix(
    model: nn.Module,
    k: int,
    values_fn: ValuesFn,
    attn_modules: list[nn.Module],
) -> Handle:
    """Insert ``k`` tokens after timm's prefix at the input of ``model.norm_pre``.

    The tokens enter before the pre-norm, as trained registers do (``_pos_embed`` ->
    ``patch_drop`` -> ``norm_pre`` -> blocks) and as the official test-time-registers code does
    (it appends before ``ln_pre``): a zero token reaches block 0 as ``norm_pre(0)``, the LayerNorm
    bias on CLIP-style models (``norm_pre`` is Identity elsewhere). Models without a ``norm_pre``
    attribute take the tokens at block 0's input. The tokens get no position (no pos-embed, and
    rope skips them as part of the prefix).

    ``model.num_prefix_tokens`` (and that of every module in ``attn_modules``, e.g. Eva's rope
    attention) is P + k from ``norm_pre`` on, so pooling, heads and ``forward_intermediates`` skip
    the tokens; it is reset to P when the next image enters ``patch_embed`` (``_pos_embed`` reads
    it) and when the handle is removed. An ``attn_mask`` reaching block 0 raises
    :class:`InputError` (its size would not count the inserted tokens).
    """
    # layout: timm's own prefix count, which it also reads while the tokens are inserted
    prefix = int(model.num_prefix_tokens)
    first_block = model.blocks[0]
    entry = getattr(model, "norm_pre", None)
    key = "input"  # nn.LayerNorm / nn.Identity name their argument ``input``
    if entry is None:
        entry, key = first_block, "x"

    def set_prefix(n: int) -> None:
        # layout: the source's bookkeeping, so its pooling and heads skip the inserted tokens
        model.num_prefix_tokens = n
        for a in attn_modules:
            a.num_prefix_tokens = n  # layout: the same for rope attention

    def insert(_mod: nn.Module, args: tuple, kwargs: dict) -> Any:
        by_kw = not args
        x = kwargs[key] if by_kw else args[0]
        extra = values_fn(x.shape[0], x)
        # layout: no grid is known here (any input size); the source's prefix count places them
        x = torch.cat([x[:, :prefix], extra, x[:, prefix:]], dim=1)
        set_prefix(prefix + k)
        return (args, {**kwargs, key: x}) if by_kw else ((x, *args[1:]), kwargs)

    def guard(_mod: nn.Module, args: tuple, kwargs: dict) -> None:
        if kwargs.get("attn_mask") is not None:
            raise InputError("attn_mask is not supported while tokens are inserted")

    def reset(_mod: nn.Module, _args: tuple) -> None:
        set_prefix(prefix)

    h_insert = entry.register_forward_pre_hook(insert, with_kwargs=True, prepend=True)
    h_guard = first_block.register_forward_pre_hook(guard, with_kwargs=True, prepend=True)
    h_reset = model.patch_embed.register_forward_pre_hook(reset, prepend=True)
    return Handle([lambda: set_prefix(prefix), h_reset.remove, h_guard.remove, h_insert.remove])
