"""``timm:NAME[.tag]``: timm's registry, hub weights, or a local weights file through timm's filters."""

from __future__ import annotations

import difflib
import os
from typing import Any

from torch import nn

from vitreg.errors import SpecError, WeightsError
from vitreg.models.load import Loaded, offline_hint, register_loader


def timm_notes(name: str, pretrained: bool, kwargs: dict) -> list[str]:
    """Known traps of timm names (see reference/timm_internals.md §7), as readable notes."""
    import timm
    from timm.models._registry import get_arch_pretrained_cfgs, split_model_name_tag

    base, tag = split_model_name_tag(name)
    notes = []
    sized = {"img_size", "dynamic_img_size"} & set(kwargs)
    if "dinov2" in base and not sized:
        notes.append(
            f"{base} takes 518x518 inputs by default (37x37 patches); pass img_size=224 or "
            "dynamic_img_size=True to vitreg.load for other sizes"
        )
    if "_clip_" in base and pretrained and not tag:
        default = next(iter(get_arch_pretrained_cfgs(base)), base)
        notes.append(
            f"untagged {base} loads its default weights {default} (a fine-tuned classifier for "
            "CLIP names); name the tag you mean, e.g. .openai or .laion2b"
        )
    if "_clip_" in base and tag.startswith("openai") and "quickgelu" not in base:
        quick = base.replace("_clip_", "_clip_quickgelu_")
        better = f"{quick}.{tag}" if timm.is_model(quick) else "a *_clip_quickgelu_* name"
        notes.append(
            f"OpenAI CLIP weights were trained with QuickGELU but {base} builds nn.GELU; "
            f"use {better} for faithful activations"
        )
    return notes


def _suggest(base: str) -> str:
    import timm

    close = difflib.get_close_matches(base, timm.list_models(), n=3, cutoff=0.6)
    return f"; did you mean {close}?" if close else "; see timm.list_models('*dinov2*')"


def _create(name: str, **kwargs: Any) -> nn.Module:
    import timm

    return timm.create_model(name, **kwargs)


@register_loader("timm")
def load_timm(
    name: str, pretrained: bool = True, weights: str | os.PathLike | None = None, **kwargs: Any
) -> Loaded:
    """Build ``name`` with timm; weights from the hub, from ``weights`` (through timm's
    checkpoint filter, so original DINOv2/OpenAI files convert), or none."""
    import timm
    from timm.models._registry import split_model_name_tag

    base, tag = split_model_name_tag(name)
    if not timm.is_model(base):
        raise SpecError(f"timm has no model named {base!r}{_suggest(base)}")
    if tag and name not in timm.list_pretrained(f"{base}.*"):
        tags = [n.split(".", 1)[1] for n in timm.list_pretrained(f"{base}.*")]
        raise SpecError(f"timm has no weights tagged {tag!r} for {base}; tags: {tags}")
    notes = timm_notes(name, pretrained or weights is not None, kwargs)
    if weights is not None:
        overlay = dict(file=str(weights))
        try:
            module = _create(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
        except TypeError:  # a wrong constructor argument, not a weights problem
            raise
        except Exception as e:
            raise WeightsError(
                f"could not load weights from {str(weights)!r} into {name}: "
                f"{type(e).__name__}: {e}. The file may be truncated or corrupt (re-download it), or "
                "belong to another architecture (check width, depth, patch size and registers)"
            ) from e
        return Loaded(module, notes=notes)
    if not pretrained:
        return Loaded(_create(name, pretrained=False, **kwargs), notes=notes)
    try:
        module = _create(name, pretrained=True, **kwargs)
    except Exception as e:
        _create(name, pretrained=False, **kwargs)  # architecture errors surface as themselves
        cfg = timm.models.get_pretrained_cfg(name)
        places = [f"hub id {cfg.hf_hub_id!r}" if cfg and cfg.hf_hub_id else None]
        places.append(f"URL {cfg.url}" if cfg and cfg.url else None)
        tried = " and ".join(p for p in places if p) or f"timm's source for {name}"
        raise WeightsError(offline_hint(tried, e)) from e
    return Loaded(module, notes=notes)
