"""Adapters for Hugging Face transformers vision towers: DINOv2 (+registers), CLIP, SigLIP.

Handles ``Dinov2Model``, ``Dinov2WithRegistersModel``, ``CLIPVisionModel`` (the LLaVA tower; v4's
``CLIPVisionTransformer``), ``CLIPVisionModelWithProjection``, ``SiglipVisionModel`` and the
``*ForImageClassification`` wrappers (the inner tower is adapted; ``forward`` stays the wrapper's).
Module names are resolved by ``hasattr`` so the transformers 4.x names also resolve.

Inserted tokens are stripped again at the encoder's output (and from ``hidden_states`` /
``attentions`` wherever HF collects them), so ``last_hidden_state``, the final norm,
``pooler_output``, heads and ``output_hidden_states`` consumers never see them.
"""

from __future__ import annotations

import copy
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import HookError, InputError, UnsupportedModelError
from vitreg.hooks.attention import (
    ATTENTION_MODES,
    NATIVE,
    RECOMPUTED,
    PatternSite,
    capture_qk,
)
from vitreg.hooks.sites import (
    Handle,
    HookContext,
    HookFn,
    InputSite,
    LayoutFn,
    OutputSite,
    Site,
    check_replacement,
)
from vitreg.hooks.streamed import StreamedPattern
from vitreg.models.adapters.base import SEARCHING, Adapter, Family, ValuesFn, register_adapter
from vitreg.models.adapters.timm_vit import image_grid

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
OPENAI_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
_TOWER_ATTRS = ("vision_model", "dinov2", "dinov2_with_registers")
_NATIVE_IMPL = "vitreg_native"


# structure ------------------------------------------------------------------------------------
def _is_tower(module: nn.Module) -> bool:
    if type(module).__name__.endswith("Backbone"):  # returns feature maps, not token sequences
        return False
    return all(hasattr(module, a) for a in ("embeddings", "encoder", "config"))


def find_tower(module: nn.Module) -> nn.Module | None:
    """The transformers module holding ``embeddings`` + ``encoder`` (itself or its vision child)."""
    if not type(module).__module__.startswith("transformers."):
        return None
    if _is_tower(module):
        return module
    if getattr(module, "main_input_name", None) != "pixel_values":
        return None  # e.g. a full CLIPModel: its forward needs text too
    for name in _TOWER_ATTRS:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module) and _is_tower(child):
            return child
    return None


def first_attr(obj: Any, *paths: str, unsupported: str = "this transformers version") -> Any:
    """The first dotted attribute path that exists (v5 names first, then v4 names)."""
    for path in paths:
        found = obj
        for part in path.split("."):
            found = getattr(found, part, None)
        if found is not None:
            return found
    raise UnsupportedModelError(
        f"{type(obj).__name__} has none of {paths}; {unsupported} is not supported"
    )


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _no_extra(layout: TokenLayout | None) -> TokenLayout | None:
    return None if layout is None else layout.with_extra(0)


def _heads_view(n_heads: int) -> tuple[Callable, Callable]:
    """(to_canon, from_canon) between a projection output ``[B, N, H*D]`` and ``[B, N, H, D]``."""

    def to_canon(out: torch.Tensor) -> torch.Tensor:
        return out.unflatten(-1, (n_heads, -1))

    def from_canon(new: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return new.reshape(out.shape)

    return to_canon, from_canon


def _first_output(out: Any) -> torch.Tensor:
    """The hidden states of a layer/encoder output (tensor, tuple or ModelOutput)."""
    return out if isinstance(out, torch.Tensor) else out[0]


def _replace_first(new: torch.Tensor, out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return new
    if isinstance(out, dict):  # ModelOutput: the first key is last_hidden_state
        out[next(iter(out.keys()))] = new
        return out
    return (new, *out[1:])


# attention patterns -----------------------------------------------------------------------------
_ROUTED: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def _eager_fn(attn: nn.Module) -> Callable | None:
    """The source's own eager attention function (transformers >= 4.48)."""
    return getattr(sys.modules.get(type(attn).__module__), "eager_attention_forward", None)


def _native_attention(module: nn.Module, query, key, value, attention_mask, **kwargs: Any):
    """Attention interface for hooked layers: the source's eager attention, with editable weights."""
    out, weights = _eager_fn(module)(module, query, key, value, attention_mask, **kwargs)
    edited = False
    for edit in list(_ROUTED.get(module, {}).get("edits", ())):
        new = edit(weights)
        if new is not None:
            weights, edited = new, True
    if edited:  # the eager path's own tail, on the edited probabilities
        out = torch.matmul(weights.to(value.dtype), value).transpose(1, 2).contiguous()
    return out, weights


def _route_native(attn: nn.Module, edit: Callable[[torch.Tensor], torch.Tensor | None]) -> Handle:
    """Run ``attn`` through :func:`_native_attention` while ``edit`` is attached.

    Only this module gets a config copy naming vitreg's interface (registered once in
    transformers' global ``AttentionInterface``); the model's shared config is untouched.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(_NATIVE_IMPL, _native_attention)
    state = _ROUTED.get(attn)
    if state is None:
        routed = copy.copy(attn.config)
        routed._attn_implementation_internal = _NATIVE_IMPL
        state = _ROUTED[attn] = {"config": attn.config, "edits": []}
        attn.config = routed
    state["edits"].append(edit)

    def remove() -> None:
        state["edits"].remove(edit)
        if not state["edits"]:
            attn.config = state["config"]
            _ROUTED.pop(attn, None)

    return Handle([remove])


@dataclass
class HFPatternSite(PatternSite):
    """``hook_pattern`` of an HF attention module.

    native: the probabilities the source's eager attention computes (the layer is routed through
    it for the hook's lifetime, also under sdpa with ``attention='native'``); a returned tensor
    replaces them and the layer's output is recomputed from it. recomputed (sdpa/flash default):
    ``softmax(q k^T * scale)`` from the hooked q/k projections, read-only.
    """

    def resolve_source(self, mode: str) -> str:
        if mode not in ATTENTION_MODES:
            raise HookError(f"attention mode must be one of {ATTENTION_MODES}, got {mode!r}")
        if mode == "recompute":
            return RECOMPUTED
        if _eager_fn(self.attn) is None:
            if mode == "native":
                raise HookError(
                    f"{self.name!r}: native HF attention patterns need transformers>=4.48; "
                    "use attention='recompute'"
                )
            return RECOMPUTED
        impl = getattr(getattr(self.attn, "config", None), "_attn_implementation", None)
        eager = impl in ("eager", _NATIVE_IMPL)
        return NATIVE if mode == "native" or eager else RECOMPUTED

    def attach(self, fn: HookFn, get_layout: LayoutFn, attention: str = "auto") -> Handle:
        if self.resolve_source(attention) == RECOMPUTED:
            return super().attach(fn, get_layout, "recompute")
        name, layer, layout_fn = self.name, self.layer, self.layout_fn

        def edit(weights: torch.Tensor) -> torch.Tensor | None:
            new = fn(weights, HookContext(name, layer, layout_fn(get_layout()), NATIVE))
            return None if new is None else check_replacement(name, weights, new)

        return _route_native(self.attn, edit)


# token insertion ------------------------------------------------------------------------------------
def _strip(value: Any, layout: TokenLayout) -> Any:
    """Drop inserted tokens from every token tensor (3-D sequences, 4-D attention maps) in ``value``."""
    n = layout.n_tokens
    if isinstance(value, torch.Tensor):
        if value.dim() == 3 and value.shape[1] == n:
            return layout.strip_extra(value, 1)
        if value.dim() == 4 and tuple(value.shape[-2:]) == (n, n):
            return layout.strip_extra(layout.strip_extra(value, 2), 3)
        return value
    if isinstance(value, dict):  # ModelOutput
        for key, item in list(value.items()):
            value[key] = _strip(item, layout)
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_strip(v, layout) for v in value)
    return value


# adapters ------------------------------------------------------------------------------------------------
class HFViTAdapter(Adapter):
    """Shared code of the HF encoder-only ViTs (pre-norm layers, separate q/k/v projections)."""

    source = "hf"
    model_types: ClassVar[tuple[str, ...]] = ()
    n_cls: ClassVar[int] = 1
    strips_extra = True

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        self.tower = find_tower(module)
        self.config = self.tower.config
        #: pass ``interpolate_pos_encoding=True`` to CLIP/SigLIP so other input sizes work
        self.interpolate_pos_encoding = bool(
            getattr(module, "vitreg_interpolate_pos_encoding", False)
        )

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        tower = find_tower(module)
        return tower is not None and getattr(tower.config, "model_type", None) in cls.model_types

    # structure ----------------------------------------------------------------------------------
    @property
    def layers(self) -> list[nn.Module]:
        return list(first_attr(self.tower.encoder, "layer", "layers"))

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def d_model(self) -> int:
        return int(self.config.hidden_size)

    @property
    def d_mlp(self) -> int:
        return int(self._mlp_out(self.layers[0]).in_features)

    @property
    def n_heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def patch_size(self) -> tuple[int, int]:
        return _pair(self.config.patch_size)

    def default_image_size(self) -> tuple[int, int]:
        return _pair(self.config.image_size)

    def base_layout(self) -> TokenLayout:
        n_reg = int(getattr(self.config, "num_register_tokens", 0) or 0)
        grid = self.grid_for(self.default_image_size())
        return TokenLayout(self.n_cls, n_reg, grid, self.patch_size)

    def grid_for(self, image_size: tuple[int, int]) -> tuple[int, int]:
        hint = (
            "enable position-embedding interpolation with vitreg.load(spec, "
            "interpolate_pos_encoding=True) or model.adapter.interpolate_pos_encoding = True"
        )
        built = self.default_image_size()
        return image_grid(
            image_size, self.patch_size, built, self.interpolate_pos_encoding, False, hint
        )

    def input_module(self) -> nn.Module:
        return self.tower.embeddings

    def embed_module(self) -> nn.Module:
        emb = self.tower.embeddings
        # Dinov2: patch_embeddings -> [B, N, C]; CLIP/SigLIP: the patch_embedding conv
        return getattr(emb, "patch_embeddings", None) or emb.patch_embedding

    def attention_path(self) -> str:
        impl = self.config._attn_implementation
        if impl == "eager":
            return (
                "eager attention; hook_pattern read natively from the weights it returns (editable)"
            )
        return (
            f"{impl} attention; hook_pattern recomputed from q/k (attention='native' routes the "
            "hooked layers through the eager path)"
        )

    # hooks ------------------------------------------------------------------------------------------
    @staticmethod
    def _attn(layer: nn.Module) -> nn.Module:
        attn = first_attr(layer, "attention", "self_attn")
        return getattr(attn, "attention", attn)  # v4 Dinov2: attention.attention holds q/k/v

    @staticmethod
    def _mlp_out(layer: nn.Module) -> nn.Linear:
        """The MLP's output projection; its input is the hidden units (gated product for SwiGLU)."""
        return first_attr(layer.mlp, "fc2", "down_proj", "weights_out")

    def _final_site(self) -> Site:
        """``ln_final.hook_out``: the final norm over all tokens (overridden for CLIP)."""
        norm = first_attr(self.tower, "layernorm", "post_layernorm")
        return OutputSite("ln_final.hook_out", None, module=norm, layout_fn=_no_extra)

    def build_sites(self) -> dict[str, Site]:
        layers = self.layers
        sites: dict[str, Site] = {
            "hook_tokens": InputSite("hook_tokens", None, module=layers[0], kwarg="hidden_states"),
        }
        for i, layer in enumerate(layers):
            sites.update({s.name: s for s in self._layer_sites(i, layer)})
        sites["ln_final.hook_out"] = self._final_site()
        return sites

    def _layer_sites(self, i: int, layer: nn.Module) -> list[Site]:
        """The canonical sites of encoder layer ``i``, in forward order."""
        p = f"blocks.{i}"
        attn = self._attn(layer)
        q, k, v = (first_attr(attn, f"{n[0]}_proj", n) for n in ("query", "key", "value"))
        ln1 = first_attr(layer, "norm1", "layer_norm1")
        ln2 = first_attr(layer, "norm2", "layer_norm2")
        to_heads, from_heads = _heads_view(self.n_heads)
        head_dim = self.d_model // self.n_heads
        scale = float(
            getattr(attn, "scaling", None) or getattr(attn, "scale", None) or head_dim**-0.5
        )

        def compute(q_out: torch.Tensor, k_out: torch.Tensor, kw: dict) -> torch.Tensor:
            q_h, k_h = to_heads(q_out).transpose(1, 2), to_heads(k_out).transpose(1, 2)
            return StreamedPattern(q_h, k_h, scale, kw.get("attention_mask"))

        heads = dict(to_canon=to_heads, from_canon=from_heads)
        return [
            InputSite(f"{p}.hook_resid_pre", i, module=layer, kwarg="hidden_states"),
            InputSite(f"{p}.ln1.hook_in", i, module=ln1),
            OutputSite(f"{p}.ln1.hook_out", i, module=ln1),
            OutputSite(f"{p}.attn.hook_q", i, module=q, **heads),
            OutputSite(f"{p}.attn.hook_k", i, module=k, **heads),
            OutputSite(f"{p}.attn.hook_v", i, module=v, **heads),
            HFPatternSite(
                f"{p}.attn.hook_pattern", i, attn=attn, capture=capture_qk(attn, q, k, compute)
            ),
            InputSite(f"{p}.hook_resid_mid", i, module=ln2),
            OutputSite(f"{p}.ln2.hook_out", i, module=ln2),
            InputSite(f"{p}.mlp.hook_post", i, module=self._mlp_out(layer)),
            OutputSite(
                f"{p}.hook_resid_post",
                i,
                module=layer,
                to_canon=_first_output,
                from_canon=_replace_first,
            ),
        ]

    # running ------------------------------------------------------------------------------------------
    def _call_kwargs(self) -> dict:
        return {"interpolate_pos_encoding": True} if self.interpolate_pos_encoding else {}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``last_hidden_state`` of the tower (inserted tokens already stripped)."""
        return _first_output(self.tower(x, **self._call_kwargs()))

    def forward(self, x: torch.Tensor) -> Any:
        return self.module(x, **self._call_kwargs())

    def insert_tokens(self, k: int, values_fn: ValuesFn) -> Handle:
        """Insert ``k`` tokens after [CLS] + registers before the pre-norm; strip them at the
        encoder's output and from the tower's collected ``hidden_states``/``attentions``.

        CLIP towers take the tokens at ``pre_layrnorm``'s input (HF's spelling of ``ln_pre``), as
        trained registers and the official test-time-registers code do, so a zero token reaches
        layer 0 as ``pre_layrnorm(0)``; towers without a pre-norm (DINOv2, SigLIP) take them at
        layer 0's input. An ``attention_mask`` reaching layer 0 raises :class:`InputError`.
        """
        state: dict[str, TokenLayout] = {}
        pre_norm = getattr(self.tower, "pre_layrnorm", None)
        first = self.layers[0]

        def record(_mod: nn.Module, args: tuple, kwargs: dict) -> None:
            h, w = (args[0] if args else kwargs["pixel_values"]).shape[-2:]
            ph, pw = self.patch_size  # the conv's floor, whatever size the caller passes
            state["layout"] = self.base_layout().with_grid((h // ph, w // pw)).with_extra(k)

        def guard(_mod: nn.Module, args: tuple, kwargs: dict) -> None:
            mask = args[1] if len(args) > 1 else kwargs.get("attention_mask")
            if mask is not None:
                raise InputError("attention_mask is not supported while tokens are inserted")

        def inserter(key: str) -> Callable:
            def insert(_mod: nn.Module, args: tuple, kwargs: dict) -> Any:
                by_kw = not args
                x = kwargs[key] if by_kw else args[0]
                layout = state["layout"]
                x = layout.with_extra(0).insert(x, values_fn(x.shape[0], x))
                layout.check(x)
                return (args, {**kwargs, key: x}) if by_kw else ((x, *args[1:]), kwargs)

            return insert

        def strip(_mod: nn.Module, _args: tuple, out: Any) -> Any:
            return _strip(out, state["layout"]) if "layout" in state else None

        if pre_norm is None:
            entry = first.register_forward_pre_hook(
                inserter("hidden_states"), with_kwargs=True, prepend=True
            )
        else:  # nn.LayerNorm names its argument ``input``
            entry = pre_norm.register_forward_pre_hook(
                inserter("input"), with_kwargs=True, prepend=True
            )
        handles = [
            self.tower.embeddings.register_forward_pre_hook(record, with_kwargs=True),
            entry,
            first.register_forward_pre_hook(guard, with_kwargs=True, prepend=True),
            self.tower.encoder.register_forward_hook(strip, prepend=True),
            self.tower.register_forward_hook(strip, prepend=True),
        ]
        return Handle([h.remove for h in handles])


@register_adapter(SEARCHING)
class HFDinov2Adapter(HFViTAdapter):
    """``Dinov2Model`` / ``Dinov2WithRegistersModel`` (+ classification wrappers).

    Position embeddings are always interpolated, so any multiple of the patch size works.
    ``ln_final.hook_out`` is ``layernorm`` (after the strip: no inserted tokens); ``features``
    is ``last_hidden_state``.
    """

    family = "hf-dinov2"
    model_types = ("dinov2", "dinov2_with_registers")

    families = (
        Family(
            "hf-dinov2",
            "DINOv2 (HF)",
            "transformers",
            ("hf:facebook/dinov2-with-registers-small", "hf:facebook/dinov2-small"),
            (
                "Needs vitreg[hf]. Positions are interpolated, so any multiple of the patch size works.",
                "The default sdpa attention returns no weights: patterns come from the eager path "
                "or from q/k, see `vitreg inspect`.",
                "HF heads pool by index ([CLS] or a mean over the rest): inserted tokens are "
                "stripped from features, but custom heads must skip them too.",
            ),
            extra="hf",
        ),
    )

    def grid_for(self, image_size: tuple[int, int]) -> tuple[int, int]:
        return image_grid(image_size, self.patch_size, None, True, False, "")

    def data_config(self) -> dict:
        """DINOv2's eval recipe (the HF processor's): resize 256, center-crop 224, ImageNet stats."""
        return dict(
            input_size=(3, 224, 224),
            interpolation="bicubic",
            mean=IMAGENET[0],
            std=IMAGENET[1],
            crop_pct=224 / 256,
            crop_mode="center",
        )


@register_adapter(SEARCHING)
class HFCLIPAdapter(HFViTAdapter):
    """``CLIPVisionModel`` (LLaVA's vision tower), v4 ``CLIPVisionTransformer``,
    ``CLIPVisionModelWithProjection``.

    HF CLIP applies ``post_layernorm`` to the pooled [CLS] only; the token sequence it returns
    (``last_hidden_state``, and the ``hidden_states`` LLaVA reads) is the un-normalised encoder
    output. So ``ln_final.hook_out`` is that encoder output (the sequence the source exposes,
    without inserted tokens; writable) and ``features`` returns ``last_hidden_state``. For
    timm-style normalised tokens apply ``tower.post_layernorm`` yourself. Inputs must have the
    configured size unless ``interpolate_pos_encoding`` is enabled.
    """

    family = "hf-clip"
    model_types = ("clip_vision_model",)

    families = (
        Family(
            "hf-clip",
            "CLIP vision (HF)",
            "transformers",
            ("hf:openai/clip-vit-large-patch14-336", "hf-vlm:llava-hf/llava-1.5-7b-hf"),
            (
                "Needs vitreg[hf]. The vision tower used by LLaVA-style VLMs, which read patch tokens "
                "of the penultimate layer.",
                "hf-vlm: loads a whole LLaVA model and wraps its tower (the VLM is model.vlm); "
                "`vitreg vlm` maps the language model's attention over the image before and after "
                "the fix.",
                "OpenAI towers use QuickGELU and a pre-layernorm (pre_layrnorm) before the blocks.",
            ),
            extra="hf",
        ),
    )

    def data_config(self) -> dict:
        """OpenAI CLIP's processor: shortest side to the model size, center crop, bicubic."""
        size = self.default_image_size()
        return dict(
            input_size=(3, *size),
            interpolation="bicubic",
            mean=OPENAI_CLIP[0],
            std=OPENAI_CLIP[1],
            crop_pct=1.0,
            crop_mode="center",
        )

    def _final_site(self) -> Site:
        return OutputSite(
            "ln_final.hook_out",
            None,
            module=self.tower.encoder,
            to_canon=_first_output,
            from_canon=_replace_first,
            layout_fn=_no_extra,
        )


@register_adapter(SEARCHING)
class HFSiglipAdapter(HFViTAdapter):
    """``SiglipVisionModel``: no [CLS]; ``ln_final.hook_out`` is ``post_layernorm`` over all tokens,
    which feeds the attention-pooling head. Inputs must have the configured size unless
    ``interpolate_pos_encoding`` is enabled."""

    family = "hf-siglip"
    model_types = ("siglip_vision_model",)
    n_cls = 0

    families = (
        Family(
            "hf-siglip",
            "SigLIP vision (HF)",
            "transformers",
            ("hf:google/siglip-base-patch16-224",),
            (
                "Needs vitreg[hf]. No [CLS] token; post_layernorm covers all tokens and feeds the "
                "attention-pooling head.",
                "Inputs must have the configured size unless interpolate_pos_encoding=True is "
                "passed to vitreg.load. Random-weight builds need the config in the HF cache.",
            ),
            extra="hf",
        ),
    )

    def data_config(self) -> dict:
        """SigLIP's processor: squash-resize to the model size, mean/std 0.5, bicubic."""
        return dict(
            input_size=(3, *self.default_image_size()),
            interpolation="bicubic",
            mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5),
            crop_pct=1.0,
            crop_mode="squash",
        )
