"""``hf:ORG/NAME`` (or a local Hugging Face directory): DINOv2 (+registers), CLIP and SigLIP towers.

``pretrained=True`` loads with ``from_pretrained`` (hub or cache); ``pretrained=False`` builds the
architecture from its config: built in for the usual DINOv2 / OpenAI CLIP ids (so it works
offline), else from the cache. Extra kwargs override config fields (``image_size=56``,
``num_hidden_layers=2``); ``attn_implementation`` ("eager"/"sdpa") and
``interpolate_pos_encoding`` (CLIP/SigLIP at other sizes) are passed on. A full ``CLIPModel`` /
``SiglipModel`` checkpoint yields its vision tower. A CLIP tower keeps a lazily loaded text side
(:mod:`vitreg.models.text_tower`): the full ``CLIPModel`` and tokenizer of the same source, read
only when a zero-shot probe asks for them.
"""

from __future__ import annotations

import os
import pickle
from functools import partial
from pathlib import Path
from typing import Any

from torch import nn

from vitreg.core.containment import check_folder
from vitreg.errors import InputError, SpecError, WeightsError
from vitreg.models.load import Loaded, offline_hint, read_state_dict, weights_read_error
from vitreg.models.text_tower import TextTower, attach

_DINOV2 = dict(mlp_ratio=4, patch_size=14, image_size=518, layer_norm_eps=1e-6, hidden_act="gelu")
_DINOV2_SIZES = {
    "small": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16),
    "giant": dict(
        hidden_size=1536, num_hidden_layers=40, num_attention_heads=24, use_swiglu_ffn=True
    ),
}
_CLIP = dict(hidden_act="quick_gelu", layer_norm_eps=1e-5)
_CLIP_L = dict(
    hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16
)

#: hub id -> (model_type, config fields): the architectures vitreg can build offline
BUILTIN_CONFIGS: dict[str, tuple[str, dict]] = {
    **{f"facebook/dinov2-{s}": ("dinov2", {**_DINOV2, **d}) for s, d in _DINOV2_SIZES.items()},
    **{
        f"facebook/dinov2-with-registers-{s}": (
            "dinov2_with_registers",
            {**_DINOV2, **d, "num_register_tokens": 4},
        )
        for s, d in _DINOV2_SIZES.items()
    },
    "openai/clip-vit-base-patch16": (
        "clip_vision_model",
        dict(
            _CLIP,
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            patch_size=16,
            image_size=224,
            projection_dim=512,
        ),
    ),
    "openai/clip-vit-large-patch14": (
        "clip_vision_model",
        dict(_CLIP, **_CLIP_L, patch_size=14, image_size=224, projection_dim=768),
    ),
    "openai/clip-vit-large-patch14-336": (
        "clip_vision_model",
        dict(_CLIP, **_CLIP_L, patch_size=14, image_size=336, projection_dim=768),
    ),
}

# model_type of the (vision) config -> transformers class built for it
_CLASSES = {
    "dinov2": "Dinov2Model",
    "dinov2_with_registers": "Dinov2WithRegistersModel",
    "clip_vision_model": "CLIPVisionModel",
    "siglip_vision_model": "SiglipVisionModel",
}
# keys derived from others at config construction (they must be recomputed, not copied)
_DERIVED = ("stage_names", "out_features", "out_indices", "_out_features", "_out_indices")


class ProcessorTransform:
    """PIL image -> ``[3, H, W]`` tensor through the model's own Hugging Face image processor."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, image: Any) -> Any:
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0]

    def __repr__(self) -> str:
        return f"ProcessorTransform({type(self.processor).__name__})"


def hub_or_folder(name: str) -> tuple[str, bool]:
    """(hub id or directory, is_local) for the name after ``hf:`` (or ``hf-vlm:``); a directory
    is checked first: transformers reads its files by name, so none may lead outside it."""
    path = Path(name).expanduser()
    if path.is_dir():
        check_folder(path, "model folder")  # one containment rule
        return str(path), True
    if name.count("/") != 1 or name.startswith((".", "/", "~")) or not all(name.split("/")):
        raise SpecError(
            f"{name!r} is neither a local directory nor a hub id ORG/NAME; e.g. "
            "hf:facebook/dinov2-with-registers-small or hf:openai/clip-vit-large-patch14-336"
        )
    return name, False


def _vision(config: Any, source: str) -> Any:
    """The vision config inside ``config`` (CLIP/SigLIP), checked against the supported types."""
    config = getattr(config, "vision_config", None) or config
    if config.model_type not in _CLASSES:
        raise SpecError(
            f"{source!r} is a {config.model_type!r} model; vitreg's hf source covers "
            f"{sorted(_CLASSES)} (use timm:... for other ViTs)"
        )
    return config


def _with_overrides(config: Any, overrides: dict) -> Any:
    """A fresh copy of ``config`` with ``overrides``; unknown fields are an error, not ignored."""
    unknown = [k for k in overrides if not hasattr(config, k)]
    if unknown:
        raise SpecError(
            f"{type(config).__name__} has no field(s) {unknown}; pass config fields such as "
            "image_size, num_hidden_layers, hidden_size, num_attention_heads"
        )
    fields = {k: v for k, v in config.to_dict().items() if k not in _DERIVED}
    return type(config).from_dict({**fields, **overrides})


def _config(source: str, is_local: bool, overrides: dict) -> Any:
    """Vision config: built in for the usual ids, else from the directory or the HF cache."""
    from transformers import AutoConfig

    if source in BUILTIN_CONFIGS:
        model_type, fields = BUILTIN_CONFIGS[source]
        return _with_overrides(AutoConfig.for_model(model_type, **fields), overrides)
    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as e:
        where = f"directory {source!r}" if is_local else f"hub id {source!r}"
        raise WeightsError(
            f"could not read the config of {where} ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}). vitreg builds only "
            f"{sorted(BUILTIN_CONFIGS)} without it. Download it on a connected machine (it then "
            "stays in the Hugging Face cache; set HF_HUB_OFFLINE=1 to use the cache only) or "
            "save a directory with config.json and load it as 'local:DIR'"
        ) from e
    return _with_overrides(_vision(config, source), overrides)


def _class(config: Any) -> type[nn.Module]:
    import transformers

    return getattr(transformers, _CLASSES[config.model_type])


def _load_weights(module: nn.Module, path: str | os.PathLike) -> None:
    """Load a state dict file, dropping a ``vision_model.`` / base-model prefix if it has one."""
    state = read_state_dict(path)
    own = set(module.state_dict())
    if not own & set(state):
        for prefix in ("vision_model.", f"{getattr(module, 'base_model_prefix', '')}."):
            if any(k.startswith(prefix) for k in state):
                state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
                break
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise WeightsError(
            f"the weights in {str(path)!r} do not fit {type(module).__name__}: "
            + " ".join(str(e).splitlines()[:3])
        ) from e


def _pretrained(source: str, is_local: bool, attn: str | None, overrides: dict) -> nn.Module:
    """``from_pretrained`` with every failure to fetch or read turned into a :class:`WeightsError`."""
    config = _config(source, is_local, overrides) if is_local or overrides else None
    if config is None:
        try:
            from transformers import AutoConfig

            config = _vision(AutoConfig.from_pretrained(source), source)
        except OSError as e:
            raise WeightsError(offline_hint(f"hub id {source!r}", e)) from e
    kwargs = {"attn_implementation": attn} if attn else {}
    try:
        return _class(config).from_pretrained(source, config=config, **kwargs)
    except pickle.UnpicklingError as e:  # torch.load(weights_only=True) met a pickled object
        pickled = sorted(Path(source).glob("*.bin")) if is_local else []
        raise weights_read_error(pickled[0] if pickled else source, e) from None
    except OSError as e:
        if is_local:
            raise WeightsError(
                f"could not load weights from directory {source!r}: {e}. It needs config.json and "
                "model.safetensors (save_pretrained writes both); --random-init builds the "
                "architecture with random weights instead"
            ) from e
        raise WeightsError(offline_hint(f"hub id {source!r}", e)) from e
    except (RuntimeError, ValueError) as e:
        raise WeightsError(
            f"the weights of {source!r} do not fit the requested architecture "
            f"(overrides {overrides}): {str(e).splitlines()[0][:300]}"
        ) from e


def _processor_transform(source: str) -> ProcessorTransform | None:
    """The model's own image processor if the directory or the cache has one, else ``None``."""
    try:
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(source, local_files_only=True)
    except Exception:  # no processor: the adapter's standard eval transform is used
        return None
    return ProcessorTransform(processor)


def load_hf(
    name: str, pretrained: bool = True, weights: str | os.PathLike | None = None, **kwargs: Any
) -> Loaded:
    """Load a transformers DINOv2 / CLIP / SigLIP vision tower (see the module docstring)."""
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise SpecError("hf: models need transformers; pip install 'vitreg[hf]'") from e
    source, is_local = hub_or_folder(name)
    attn = kwargs.pop("attn_implementation", None)
    interpolate = bool(kwargs.pop("interpolate_pos_encoding", False))
    if pretrained and weights is None:
        module = _pretrained(source, is_local, attn, kwargs)
    else:
        config = _config(source, is_local, kwargs)
        module = _class(config)._from_config(
            config, **({"attn_implementation": attn} if attn else {})
        )
        if weights is not None:
            _load_weights(module, weights)
    if interpolate:
        module.vitreg_interpolate_pos_encoding = True
    if module.config.model_type == "clip_vision_model":
        attach(module, TextTower("hf", source, partial(_clip_text, source, pretrained, weights)))
    kind = "user" if is_local and pretrained and weights is None else None
    return Loaded(module, transform=_processor_transform(source), weights=kind)


def _clip_text(
    source: str, pretrained: bool, weights: str | os.PathLike | None
) -> tuple[nn.Module, Any]:
    """The full ``CLIPModel`` (its weights when ``pretrained``, else random) and the tokenizer of
    ``source``, for zero-shot; the vision tower vitreg wraps is not replaced."""
    from transformers import AutoConfig, AutoTokenizer, CLIPModel

    if weights is not None:
        raise InputError(
            f"the vision weights came from the file {str(weights)!r}, which has no text tower "
            "vitreg can pair with them; save the full CLIPModel with save_pretrained and load "
            "that directory as hf:DIR"
        )
    what = "the CLIP text tower (config, weights and tokenizer files)"
    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as e:
        raise WeightsError(offline_hint(f"{what} of {source!r}", e)) from e
    if config.model_type != "clip":
        raise InputError(
            f"{source!r} holds a {config.model_type!r}, not a full CLIPModel: it has no text "
            "tower; load a CLIPModel checkpoint (e.g. hf:openai/clip-vit-base-patch16) or a "
            "directory saved from one"
        )
    try:
        clip = CLIPModel.from_pretrained(source) if pretrained else CLIPModel._from_config(config)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as e:
        raise WeightsError(offline_hint(f"{what} of {source!r}", e)) from e
    ids = tokenizer("a photo of a dog", add_special_tokens=False)["input_ids"]
    if not ids or all(i == tokenizer.unk_token_id for i in ids):  # built without vocab files
        raise InputError(
            f"{source!r} has no usable CLIP tokenizer (every word is unknown): save the "
            "tokenizer next to the model (CLIPTokenizer.save_pretrained writes vocab.json and "
            "merges.txt) or load the hub id, whose tokenizer files the cache holds"
        )
    return clip.eval(), tokenizer
