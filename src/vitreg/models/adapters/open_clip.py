"""Adapter for open_clip's ``VisionTransformer``: the ``.visual`` tower of CLIP, OpenCLIP, CLIPA, CoCa.

Where things are (open_clip 3.3; reference/timm_internals.md §6.2):

- tokens ``[CLS, patches]`` enter ``transformer.resblocks[0]`` after ``ln_pre`` (inserted tokens
  join before ``ln_pre``, as in the official test-time-registers code); each block is a
  ``ResidualAttentionBlock`` (``ln_1``, ``attn`` = ``nn.MultiheadAttention``, ``ln_2``,
  ``mlp`` = ``c_fc -> gelu -> c_proj``). ``transformer.batch_first`` says whether the blocks
  see ``[B, N, C]`` or ``[N, B, C]``; canonical tensors are batch-first either way.
- ``nn.MultiheadAttention`` has no q/k/v modules and runs a fused kernel in eval (hooks on
  ``attn.out_proj`` never fire). ``hook_q/k/v`` are computed from the query MHA receives and
  ``in_proj_weight``/``in_proj_bias`` (read-only). ``hook_pattern`` is recomputed from them; with
  ``attention='native'`` the block asks MHA for its per-head weights instead (read-only too).
- ``ln_post``: the usual towers (``pool_type='tok'``) normalise the whole sequence, then pool
  ``[CLS]`` and project, so ``ln_final.hook_out`` is ``ln_post``'s output and :meth:`features`
  returns it. CLIPA (``final_ln_after_pool``) and the CoCa pooler normalise pooled vectors only:
  those towers have no ``ln_final.hook_out`` and :meth:`features` returns the final residual
  stream (what open_clip itself returns as ``tokens``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import HookError
from vitreg.hooks.attention import (
    ATTENTION_MODES,
    NATIVE,
    RECOMPUTED,
    PatternSite,
)
from vitreg.hooks.sites import Handle, HookContext, HookFn, InputSite, LayoutFn, OutputSite, Site
from vitreg.hooks.streamed import StreamedPattern
from vitreg.models.adapters.base import EXACT, Adapter, Family, ValuesFn, register_adapter
from vitreg.models.adapters.timm_vit import image_grid

Convert = tuple[Callable[[Any], torch.Tensor], Callable[[torch.Tensor, Any], Any]]


def _keep(t: torch.Tensor) -> torch.Tensor:
    return t


def _keep_new(new: torch.Tensor, _old: Any) -> torch.Tensor:
    return new


def _swap(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1)


def _swap_new(new: torch.Tensor, _old: Any) -> torch.Tensor:
    return new.transpose(0, 1)


def token_convert(seq_first: bool) -> Convert:
    """(to_canon, from_canon) between the blocks' token tensors and batch-first ``[B, N, C]``."""
    return (_swap, _swap_new) if seq_first else (_keep, _keep_new)


def in_proj(attn: nn.MultiheadAttention, index: int, seq_first: bool) -> Callable:
    """q (0), k (1) or v (2) ``[B, N, H, D]`` of MHA's packed input projection applied to ``x``."""
    c = attn.embed_dim

    def project(x: torch.Tensor) -> torch.Tensor:
        x = _swap(x) if seq_first else x
        rows = slice(index * c, (index + 1) * c)
        bias = None if attn.in_proj_bias is None else attn.in_proj_bias[rows]
        return F.linear(x, attn.in_proj_weight[rows], bias).unflatten(-1, (attn.num_heads, -1))

    return project


def _plain_mha(attn: nn.Module) -> bool:
    return (
        isinstance(attn, nn.MultiheadAttention)
        and attn.in_proj_weight is not None
        and attn.bias_k is None
        and not attn.add_zero_attn
    )


@dataclass
class MHAPatternSite(PatternSite):
    """``hook_pattern`` of a ``ResidualAttentionBlock``: recomputed by default, or native.

    Native: while a hook is attached, the block's ``attention`` method is overridden on the
    instance so that MHA is called with ``need_weights=True, average_attn_weights=False`` and its
    ``[B, H, N, N]`` weights are passed to the hooks; the override is removed with the last hook.
    """

    block: nn.Module | None = None
    listeners: list[Callable[[torch.Tensor], None]] = field(default_factory=list, repr=False)

    def resolve_source(self, mode: str) -> str:
        if mode not in ATTENTION_MODES:
            raise HookError(f"attention mode must be one of {ATTENTION_MODES}, got {mode!r}")
        return NATIVE if mode == "native" else RECOMPUTED

    def attach(self, fn: HookFn, get_layout: LayoutFn, attention: str = "auto") -> Handle:
        if self.resolve_source(attention) == RECOMPUTED:
            return super().attach(fn, get_layout, attention)
        name, layer, layout_fn = self.name, self.layer, self.layout_fn

        def listener(weights: torch.Tensor) -> None:
            if fn(weights, HookContext(name, layer, layout_fn(get_layout()), NATIVE)) is not None:
                raise HookError(
                    f"{name!r} is read-only on open_clip models: nn.MultiheadAttention returns "
                    "its weights but takes no edited ones back; edit q/k upstream (ln1.hook_out)"
                )

        if not self.listeners:
            self.block.attention = self._attention_with_weights()
        self.listeners.append(listener)

        def remove() -> None:
            self.listeners.remove(listener)
            if not self.listeners:
                del self.block.attention

        return Handle([remove])

    def _attention_with_weights(self) -> Callable[..., torch.Tensor]:
        """``ResidualAttentionBlock.attention`` asking MHA for per-head weights."""
        attn, listeners = self.block.attn, self.listeners

        def attention(
            q_x: torch.Tensor,
            k_x: torch.Tensor | None = None,
            v_x: torch.Tensor | None = None,
            attn_mask: torch.Tensor | None = None,
        ) -> torch.Tensor:
            k_x = q_x if k_x is None else k_x
            v_x = q_x if v_x is None else v_x
            mask = None if attn_mask is None else attn_mask.to(q_x.dtype)
            out, weights = attn(
                q_x, k_x, v_x, need_weights=True, average_attn_weights=False, attn_mask=mask
            )
            for listen in list(listeners):
                listen(weights)
            return out

        return attention


def recompute_capture(attn: nn.MultiheadAttention, seq_first: bool) -> Callable:
    """A ``PatternSite.capture``: softmax(q k^T / sqrt(d)) from the query MHA is called with."""
    q_of, k_of = in_proj(attn, 0, seq_first), in_proj(attn, 1, seq_first)

    def capture(callback: Callable[[torch.Tensor], None]) -> list[Any]:
        def on_call(_mod: nn.Module, args: tuple, kwargs: dict) -> None:
            if kwargs.get("attn_mask") is not None:
                raise HookError(
                    "recomputed patterns do not support attn_mask; use attention='native'"
                )
            x = args[0] if args else kwargs["query"]
            q, k = q_of(x).transpose(1, 2), k_of(x).transpose(1, 2)
            callback(StreamedPattern(q, k, attn.head_dim**-0.5))

        return [attn.register_forward_pre_hook(on_call, with_kwargs=True)]

    return capture


@register_adapter(EXACT)
class OpenClipViTAdapter(Adapter):
    """open_clip ``VisionTransformer`` with ``ResidualAttentionBlock`` blocks (plain MHA)."""

    family = "open_clip-vit"
    source = "open_clip"
    strips_extra = True

    families = (
        Family(
            "openclip",
            "OpenCLIP",
            "open_clip",
            ("open_clip:ViT-B-16/laion2b_s34b_b88k",),
            (
                "Spec is ARCH/PRETRAINED_TAG as in open_clip.list_pretrained(); needs vitreg[openclip].",
                "open_clip calls nn.MultiheadAttention with need_weights=False: patterns come from "
                "q/k, see `vitreg inspect` for the path used.",
                "Towers built on a timm trunk (SigLIP, EVA-02 configs) are handled by the timm "
                "adapters of that trunk.",
            ),
            extra="openclip",
        ),
    )

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        if not self.ln_post_on_tokens:
            self.notes.append(
                "this open_clip tower applies ln_post to pooled vectors only (CLIPA / CoCa "
                "pooler): there is no ln_final.hook_out and features() returns the final "
                "residual stream, un-normalised"
            )

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        try:
            from open_clip.transformer import ResidualAttentionBlock, VisionTransformer
        except ImportError:
            return False
        if not isinstance(module, VisionTransformer):
            return False
        return all(
            isinstance(b, ResidualAttentionBlock) and _plain_mha(b.attn)
            for b in module.transformer.resblocks
        )

    # structure ----------------------------------------------------------------------
    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.module.transformer.resblocks)

    @property
    def seq_first(self) -> bool:
        """True when the blocks run sequence-first (``[N, B, C]``, older open_clip)."""
        return not getattr(self.module.transformer, "batch_first", True)

    @property
    def ln_post_on_tokens(self) -> bool:
        """Whether ``ln_post`` normalises the token sequence (not only a pooled vector)."""
        m = self.module
        if m.attn_pool is not None:
            return m.attn_pool_contrastive is not None
        return not m.final_ln_after_pool

    @property
    def n_layers(self) -> int:
        return len(self.module.transformer.resblocks)

    @property
    def d_model(self) -> int:
        return int(self.module.transformer.width)

    @property
    def d_mlp(self) -> int:
        return int(self.blocks[0].mlp.c_fc.out_features)

    @property
    def n_heads(self) -> int:
        return int(self.blocks[0].attn.num_heads)

    def base_layout(self) -> TokenLayout:
        stride = tuple(int(s) for s in self.module.conv1.stride)
        return TokenLayout(1, 0, self.grid_for(self.default_image_size()), stride)

    def default_image_size(self) -> tuple[int, int]:
        return tuple(int(s) for s in self.module.image_size)

    def grid_for(self, image_size: tuple[int, int]) -> tuple[int, int]:
        hint = (
            "build it for that size: vitreg.load('open_clip:ARCH/TAG', force_image_size=(H, W)) "
            "(open_clip resamples the position embeddings when it loads weights)"
        )
        stride = tuple(int(s) for s in self.module.conv1.stride)
        return image_grid(image_size, stride, self.default_image_size(), False, False, hint)

    def input_module(self) -> nn.Module:
        return self.module.conv1

    def attention_path(self) -> str:
        return (
            "nn.MultiheadAttention (fused in eval); hook_pattern recomputed from q/k "
            "(attention='native' asks MHA for its weights; both read-only)"
        )

    # hooks -----------------------------------------------------------------------------
    def build_sites(self) -> dict[str, Site]:
        seq_first = self.seq_first
        to, back = token_convert(seq_first)

        def tokens_in(name: str, layer: int | None, module: nn.Module, kwarg: str | None = None):
            return InputSite(name, layer, module=module, kwarg=kwarg, to_canon=to, from_canon=back)

        def tokens_out(name: str, layer: int | None, module: nn.Module) -> OutputSite:
            return OutputSite(name, layer, module=module, to_canon=to, from_canon=back)

        first = self.blocks[0]
        sites: dict[str, Site] = {"hook_tokens": tokens_in("hook_tokens", None, first, "q_x")}
        for i, blk in enumerate(self.blocks):
            p, attn = f"blocks.{i}", blk.attn
            qkv = {
                part: InputSite(
                    f"{p}.attn.hook_{part}",
                    i,
                    module=attn,
                    kwarg="query",
                    to_canon=in_proj(attn, index, seq_first),
                    writable=False,
                )
                for index, part in enumerate("qkv")
            }
            sites.update(
                {
                    f"{p}.hook_resid_pre": tokens_in(f"{p}.hook_resid_pre", i, blk, "q_x"),
                    f"{p}.ln1.hook_in": tokens_in(f"{p}.ln1.hook_in", i, blk.ln_1),
                    f"{p}.ln1.hook_out": tokens_out(f"{p}.ln1.hook_out", i, blk.ln_1),
                    f"{p}.attn.hook_q": qkv["q"],
                    f"{p}.attn.hook_k": qkv["k"],
                    f"{p}.attn.hook_v": qkv["v"],
                    f"{p}.attn.hook_pattern": MHAPatternSite(
                        f"{p}.attn.hook_pattern",
                        i,
                        attn=attn,
                        block=blk,
                        capture=recompute_capture(attn, seq_first),
                    ),
                    f"{p}.hook_resid_mid": tokens_in(f"{p}.hook_resid_mid", i, blk.ln_2),
                    f"{p}.ln2.hook_out": tokens_out(f"{p}.ln2.hook_out", i, blk.ln_2),
                    f"{p}.mlp.hook_post": tokens_out(f"{p}.mlp.hook_post", i, blk.mlp.gelu),
                    f"{p}.hook_resid_post": tokens_out(f"{p}.hook_resid_post", i, blk),
                }
            )
        if self.ln_post_on_tokens:
            # inserted tokens are stripped before ln_post, so its layout has none
            sites["ln_final.hook_out"] = OutputSite(
                "ln_final.hook_out", None, module=self.module.ln_post, layout_fn=_no_extra
            )
        return sites

    # running -----------------------------------------------------------------------------
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``ln_post`` output over all tokens (or the final residual stream, see module doc).

        Read from the tower's own forward; inserted tokens were already stripped where the
        transformer ends (``strips_extra``).
        """
        m = self.module
        target = m.ln_post if self.ln_post_on_tokens else m.transformer
        seen: list[torch.Tensor] = []
        handle = target.register_forward_hook(lambda _m, _a, out: seen.append(out))
        try:
            m(x)
        finally:
            handle.remove()
        return seen[-1]

    def insert_tokens(self, k: int, values_fn: ValuesFn) -> Handle:
        """Insert ``k`` tokens after [CLS] at ``ln_pre``'s input; strip them where the transformer
        ends.

        The tokens enter before the pre-norm, as in the official test-time-registers code
        (conv1 -> [CLS] -> pos-embed -> zero tokens -> patch_dropout -> ``ln_pre`` -> blocks),
        so a zero token reaches block 0 as ``ln_pre(0)``. ``ln_pre`` (Identity with
        ``no_ln_pre``) always sees batch-first ``[B, N, C]``; only the blocks may run
        sequence-first. They enter after ``patch_dropout`` (inactive in eval), so patch dropout
        in training never drops them. Towers without ``ln_pre`` take them at block 0's input.

        Stripping happens in a forward hook on ``transformer`` and, for ``forward_intermediates``
        (which calls ``transformer.forward_intermediates`` and hard-codes one prefix token), in a
        per-instance wrapper of that method; so pooling, ``ln_post``, ``proj``, returned tokens
        and intermediates never see the inserted tokens.
        """
        tr = self.module.transformer
        source = self.base_layout()
        layout = source.with_extra(k)
        entry = getattr(self.module, "ln_pre", None)
        if entry is None:
            entry, key, (to, back) = self.blocks[0], "q_x", token_convert(self.seq_first)
        else:  # before the transformer: batch-first in every open_clip version
            key, (to, back) = "input", token_convert(False)

        def insert(_mod: nn.Module, args: tuple, kwargs: dict) -> Any:
            by_kw = not args
            raw = kwargs[key] if by_kw else args[0]
            x = to(raw)
            extra = values_fn(x.shape[0], x)
            x = back(torch.cat([x[:, source.prefix], extra, x[:, source.patches]], dim=1), raw)
            return (args, {**kwargs, key: x}) if by_kw else ((x, *args[1:]), kwargs)

        original = tr.forward_intermediates
        previous = vars(tr).get("forward_intermediates")

        def forward_intermediates(*args: Any, **kwargs: Any) -> tuple:
            x, intermediates = original(*args, **kwargs)
            return layout.strip_extra(x), [layout.strip_extra(t) for t in intermediates]

        def restore_intermediates() -> None:
            if previous is None:
                del tr.forward_intermediates
            else:
                tr.forward_intermediates = previous

        h_insert = entry.register_forward_pre_hook(insert, with_kwargs=True, prepend=True)
        h_strip = tr.register_forward_hook(lambda _m, _a, out: layout.strip_extra(out))
        tr.forward_intermediates = forward_intermediates
        return Handle([restore_intermediates, h_strip.remove, h_insert.remove])

    # preprocessing ----------------------------------------------------------------------
    def _preprocess_cfg(self) -> dict:
        from open_clip.transform import PreprocessCfg

        own = getattr(self.module, "preprocess_cfg", {})
        return {**asdict(PreprocessCfg()), **own, "size": self.default_image_size()}

    def data_config(self) -> dict:
        cfg = self._preprocess_cfg()
        return {
            "input_size": (3, *cfg["size"]),
            "mean": tuple(cfg["mean"]),
            "std": tuple(cfg["std"]),
            "interpolation": cfg["interpolation"],
            "crop_pct": 1.0,
            "crop_mode": "center",
        }

    def transform(self) -> Callable:
        """open_clip's own eval preprocessing for this tower's size and normalisation."""
        from open_clip.transform import PreprocessCfg, image_transform_v2

        return image_transform_v2(PreprocessCfg(**self._preprocess_cfg()), is_train=False)


def _no_extra(layout: TokenLayout | None) -> TokenLayout | None:
    return None if layout is None else layout.with_extra(0)
