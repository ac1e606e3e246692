"""``open_clip:ARCH[/TAG]``: open_clip's model registry, its pretrained tags, or a local weights file.

The module vitreg wraps is the vision tower ``model.visual``; the transform is open_clip's eval
preprocessing; the full CLIP model (text tower, ``logit_scale``) stays reachable through
:func:`vitreg.models.text_tower.text_tower` for zero-shot probes. Towers built on a timm trunk
(``TimmModel``: SigLIP, EVA02, ...) are unwrapped to ``visual.trunk`` so the timm adapters
handle them.
"""

from __future__ import annotations

import difflib
import os
import pickle
import warnings
from typing import Any

from vitreg.errors import SpecError, WeightsError
from vitreg.models.load import Loaded, offline_hint, weights_read_error
from vitreg.models.text_tower import TextTower, attach


def _check_name(arch: str, tag: str) -> None:
    """Raise :class:`SpecError` for an architecture or tag open_clip does not know."""
    import open_clip

    archs = open_clip.list_models()
    if arch not in archs:
        by_lower = {a.lower(): a for a in archs}
        close = difflib.get_close_matches(arch.lower(), list(by_lower), n=4, cutoff=0.5)
        close = [by_lower[c] for c in close]
        hint = f"did you mean {close}?" if close else "see open_clip.list_models()"
        raise SpecError(f"open_clip has no architecture named {arch!r}; {hint}")
    if tag and not open_clip.is_pretrained_cfg(arch, tag):
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise SpecError(f"open_clip has no weights tagged {tag!r} for {arch}; tags: {tags}")


def _gelu_note(arch: str, tag: str, kwargs: dict) -> list[str]:
    """Note a QuickGELU mismatch between the tag's training and the architecture built."""
    import open_clip

    trained_quick = bool(open_clip.get_pretrained_cfg(arch, tag).get("quick_gelu", False))
    built_quick = bool(open_clip.get_model_config(arch).get("quick_gelu", False))
    built_quick = built_quick or bool(kwargs.get("force_quick_gelu", False))
    if trained_quick == built_quick:
        return []
    if trained_quick:
        quick = f"{arch}-quickgelu"
        fix = f"open_clip:{quick}/{tag}" if quick in open_clip.list_models() else None
        better = f"use {fix} or pass force_quick_gelu=True" if fix else "pass force_quick_gelu=True"
        return [
            f"{arch}/{tag} weights were trained with QuickGELU but {arch} builds nn.GELU, so "
            f"activations are not faithful; {better}"
        ]
    return [f"{arch}/{tag} weights were trained with nn.GELU but this build uses QuickGELU"]


def _download(arch: str, tag: str, cache_dir: str | None) -> None:
    """Fetch the tag's checkpoint into the cache, or raise :class:`WeightsError` saying why not."""
    import open_clip

    cfg = open_clip.get_pretrained_cfg(arch, tag)
    try:
        open_clip.download_pretrained(cfg, cache_dir=cache_dir)
    except Exception as e:
        places = [f"hub id {cfg['hf_hub']!r}" if cfg.get("hf_hub") else None]
        places.append(f"URL {cfg['url']}" if cfg.get("url") else None)
        tried = " and ".join(p for p in places if p) or f"open_clip's source for {arch}/{tag}"
        raise WeightsError(offline_hint(tried, e)) from e


def _tag_preprocess(arch: str, tag: str, kwargs: dict) -> dict:
    """The tag's normalisation as create_model_and_transforms kwargs (for a weights file)."""
    import open_clip

    cfg = open_clip.get_pretrained_cfg(arch, tag)
    keys = {"mean": "image_mean", "std": "image_std", "interpolation": "image_interpolation"}
    keys["resize_mode"] = "image_resize_mode"
    return {arg: cfg[k] for k, arg in keys.items() if k in cfg and arg not in kwargs}


def load_open_clip(
    name: str, pretrained: bool = True, weights: str | os.PathLike | None = None, **kwargs: Any
) -> Loaded:
    """Build ``ARCH`` with open_clip; weights from ``TAG``, from ``weights`` (a full open_clip
    checkpoint file), or none (``ARCH`` alone or ``pretrained=False``). Extra kwargs go to
    ``open_clip.create_model_and_transforms`` (e.g. ``force_image_size``, ``force_quick_gelu``)."""
    import open_clip
    from open_clip.timm_model import TimmModel

    arch, _, tag = name.partition("/")
    _check_name(arch, tag)
    notes: list[str] = []
    source: str | None = None
    if weights is not None:
        source = str(weights)
        if tag:
            kwargs = {**_tag_preprocess(arch, tag, kwargs), **kwargs}
        else:
            notes.append(
                f"weights from a file: preprocessing uses open_clip's defaults (OpenAI mean/std); "
                f"name the tag too (open_clip:{arch}/TAG) or pass image_mean/image_std to match "
                "the weights"
            )
    elif pretrained and tag:
        _download(arch, tag, kwargs.get("cache_dir"))
        source = tag
    elif pretrained:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        fix = f"use open_clip:{arch}/TAG with a tag from {tags}" if tags else "open_clip has none"
        notes.append(f"open_clip:{arch} names no weights tag, so its weights are random; {fix}")
    if tag and source is not None:
        notes += _gelu_note(arch, tag, kwargs)
    if source is None:
        kwargs.setdefault("pretrained_text", False)  # no hub download for HF text towers
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="QuickGELU mismatch")  # noted above
            model, _, preprocess = open_clip.create_model_and_transforms(
                arch, pretrained=source, **kwargs
            )
    except TypeError:  # a wrong constructor argument, not a weights problem
        raise
    except Exception as e:
        if isinstance(e, pickle.UnpicklingError) and weights is not None:
            raise weights_read_error(weights, e) from None
        if weights is not None:
            first = " ".join(str(e).split())[:300]
            raise WeightsError(
                f"could not load {str(weights)!r} into open_clip {arch}: {type(e).__name__}: "
                f"{first}. It must be a complete open_clip checkpoint (visual.* and text tower "
                "keys) of this architecture, as a safetensors file or a torch state dict; "
                "open_clip loads it strictly"
            ) from None
        if isinstance(e, OSError):  # e.g. an HF text tower whose config lives on the hub
            raise WeightsError(offline_hint(f"the hub files open_clip needs for {arch}", e)) from e
        raise
    visual = model.visual
    kind = "random" if source is None else None  # an untagged pretrained=True included
    if isinstance(visual, TimmModel):
        notes.append(
            f"open_clip {arch} wraps a timm trunk ({type(visual.trunk).__name__}); vitreg uses "
            "model.visual.trunk, so forward() returns the trunk's output without open_clip's "
            "projection head (visual.head)"
        )
        return Loaded(visual.trunk, preprocess, notes, weights=kind)
    attach(visual, TextTower("open_clip", name, lambda: (model, open_clip.get_tokenizer(arch))))
    return Loaded(visual, preprocess, notes, weights=kind)
