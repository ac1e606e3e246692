"""Adapter for timm ``Eva``: DINOv3, EVA-02 and the rope ViTs (pre-norm ``EvaBlock``, rope attention).

Differences from :class:`TimmViTAdapter` it builds on: the layout's registers come from
``reg_token`` (Eva has no ``num_reg_tokens``); ``hook_pattern`` is recomputed with rope applied
exactly as the attention does (prefix tokens unrotated); ``hook_v`` reads ``v_proj`` when q/k/v are
separate (EVA-02 B/L) and adds ``v_bias`` when a qkv bias bypasses ``attn.qkv`` (EVA-02 T/S,
DINOv3 ``_qkvb``); inserted tokens also bump every ``blk.attn.num_prefix_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.hooks.attention import PatternSite, capture_qk
from vitreg.hooks.sites import Handle, HookFn, LayoutFn, OutputSite, Site
from vitreg.hooks.streamed import StreamedPattern
from vitreg.models.adapters.base import EXACT, Family, ValuesFn, register_adapter
from vitreg.models.adapters.timm_vit import TimmViTAdapter, insert_after_prefix, qkv_part


@dataclass
class BiasedVSite(OutputSite):
    """``hook_v`` of a fused qkv whose bias timm adds in ``F.linear``, bypassing ``attn.qkv``.

    While attached it sets ``attn.qkv_bias_separate`` (timm then calls ``attn.qkv`` and adds the
    bias afterwards; outputs move by ~1 ulp, not bit-identical) and shows v with ``v_bias`` added.
    """

    attn: nn.Module | None = None

    def attach(self, fn: HookFn, get_layout: LayoutFn, attention: str = "auto") -> Handle:
        attn, before = self.attn, self.attn.qkv_bias_separate
        attn.qkv_bias_separate = True
        handle = super().attach(fn, get_layout, attention)
        handle.add(lambda: setattr(attn, "qkv_bias_separate", before))
        return handle


def _v_site(name: str, layer: int, attn: nn.Module) -> Site:
    """``hook_v`` ``[B, N, H_kv, D]`` for each way Eva attention computes v."""
    if attn.qkv is None:
        heads = int(getattr(attn, "num_kv_heads", attn.num_heads))
        return OutputSite(
            name,
            layer,
            module=attn.v_proj,
            to_canon=lambda out: out.reshape(*out.shape[:2], heads, -1),
            from_canon=lambda new, out: new.reshape(out.shape),
        )
    to_canon, from_canon = qkv_part(2, attn.num_heads)
    if getattr(attn, "q_bias", None) is None:
        return OutputSite(name, layer, module=attn.qkv, to_canon=to_canon, from_canon=from_canon)

    def bias() -> torch.Tensor:
        return attn.v_bias.reshape(attn.num_heads, -1)

    return BiasedVSite(
        name,
        layer,
        module=attn.qkv,
        attn=attn,
        to_canon=lambda out: to_canon(out) + bias(),
        from_canon=lambda new, out: from_canon(new - bias(), out),
    )


def rope_pattern(attn: nn.Module) -> Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]:
    """``compute`` for :func:`capture_qk`: softmax of q_norm/k_norm outputs with the call's rope.

    Mirrors ``EvaAttention``/``AttentionRope``: the first ``attn.num_prefix_tokens`` tokens stay
    unrotated, ``attn.rotate_half`` picks the rotation layout, grouped kv heads are repeated.
    """
    from timm.layers import apply_rot_embed_cat

    def rotate(t: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        # layout: the attention's own prefix count (inserted tokens included), as timm reads it
        n = attn.num_prefix_tokens
        half = bool(getattr(attn, "rotate_half", False))
        # layout: mirrors timm's rope split of [B, H, N, D] at its own prefix count
        rotated = apply_rot_embed_cat(t[:, :, n:], rope, half=half)
        return torch.cat([t[:, :, :n], rotated], dim=2).type_as(t)  # layout: as above

    def compute(q: torch.Tensor, k: torch.Tensor, kw: dict) -> torch.Tensor:
        rope = kw.get("rope")
        if rope is not None:
            q, k = rotate(q, rope), rotate(k, rope)
        groups = int(getattr(attn, "num_kv_groups", 1))
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
        return StreamedPattern(q, k, attn.scale, kw.get("attn_mask"), kw.get("is_causal", False))

    return compute


@register_adapter(EXACT)
class TimmEvaAdapter(TimmViTAdapter):
    """timm ``Eva`` with pre-norm ``EvaBlock``s (``EvaAttention`` or ``AttentionRope``)."""

    family = "timm-eva"

    families = (
        Family(
            "dinov3",
            "DINOv3",
            "timm",
            ("timm:vit_small_patch16_dinov3.lvd1689m",),
            (
                "timm Eva class: rope instead of absolute positions, 4 trained registers, LayerScale "
                "as bare gamma_1/gamma_2 parameters (no module to hook).",
                "Default 256 px, any multiple of 16 works; timm pools by average, upstream DINOv3 uses "
                "[CLS] (pass global_pool='token').",
                "S+/H+/7B use SwiGLU MLPs; *_qkvb variants add the qkv bias inside F.linear, "
                "bypassing hooks on attn.qkv.",
            ),
        ),
        Family(
            "eva02",
            "EVA-02",
            "timm",
            ("timm:eva02_base_patch14_224.mim_in22k",),
            (
                "timm Eva class: rope plus absolute positions, no LayerScale.",
                "T/S use a packed SwiGLU MLP; B/L use SwiGLU with a LayerNorm before fc2, so "
                "mlp.hook_post is the hidden unit before that norm.",
                "MIM models pool by average (fc_norm); mean/std are the OpenAI CLIP constants.",
            ),
        ),
    )

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        try:
            from timm.layers import AttentionRope
            from timm.models.eva import Eva, EvaAttention, EvaBlock
        except ImportError:  # pragma: no cover - timm is a core dependency
            return False
        if not isinstance(module, Eva):
            return False
        return all(
            isinstance(b, EvaBlock)
            and isinstance(b.attn, (EvaAttention, AttentionRope))
            and hasattr(b.mlp, "drop1")
            for b in module.blocks
        )

    def base_layout(self) -> TokenLayout:
        m = self.module
        n_cls = 1 if m.cls_token is not None else 0
        n_reg = 0 if m.reg_token is None else int(m.reg_token.shape[1])
        grid = tuple(int(g) for g in m.patch_embed.grid_size)
        return TokenLayout(n_cls, n_reg, grid, tuple(m.patch_embed.patch_size))

    def attention_path(self) -> str:
        fused = any(getattr(b.attn, "fused_attn", False) for b in self.module.blocks)
        if fused:
            return (
                "fused SDPA; hook_pattern recomputed from q/k with rope applied as the model does "
                "(attention='native' unfuses)"
            )
        return "unfused; hook_pattern read natively from attn.attn_drop"

    def build_sites(self) -> dict[str, Site]:
        """The plain-ViT sites, with Eva's own ``hook_v`` and rope-aware ``hook_pattern``.

        ``hook_q``/``hook_k`` are the q_norm/k_norm outputs (bias included, before rope),
        ``[B, N, H, D]`` (``H_kv`` heads for k under grouped-query attention).
        """
        sites = super().build_sites()
        for i, blk in enumerate(self.module.blocks):
            p, attn = f"blocks.{i}.attn", blk.attn
            sites[f"{p}.hook_v"] = _v_site(f"{p}.hook_v", i, attn)
            sites[f"{p}.hook_pattern"] = PatternSite(
                f"{p}.hook_pattern",
                i,
                attn=attn,
                native_module=attn.attn_drop,
                capture=capture_qk(attn, attn.q_norm, attn.k_norm, rope_pattern(attn)),
            )
        return sites

    def insert_tokens(self, k: int, values_fn: ValuesFn) -> Handle:
        """Insert after the prefix (rope needs them there); prefix counts of every attention follow.

        The tokens enter at ``norm_pre``'s input, before the pre-norm, as trained registers do
        (``_pos_embed`` -> ``norm_pre`` -> blocks; ``norm_pre`` is a LayerNorm only with
        ``use_pre_transformer_norm``, e.g. Perception Encoder, and Identity for DINOv3/EVA-02).
        ``_pos_embed`` returns the rope table for the patches alone; the tokens sit in the
        (unrotated) prefix, so they get no position. With ``global_pool='map'`` Eva's attention
        pool reads every token, prefix included, so it sees inserted tokens just as it sees [CLS]
        and registers.
        """
        m = self.module
        attns = [b.attn for b in m.blocks]
        return insert_after_prefix(m, k, values_fn, attn_modules=attns)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``forward_features``: tokens after ``norm`` (Identity for EVA-02 MIM, whose LN is fc_norm)."""
        return self.module.forward_features(x)
