"""``timm:NAME[.tag]``: timm's registry, hub weights, or a local weights file (timm's filters, strict)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from typing import Any

from torch import nn

from vitreg.errors import SpecError, WeightsError
from vitreg.models.input_size import check_built_size
from vitreg.models.load import (
    Loaded,
    load_strict,
    offline_hint,
    read_state_dict,
    register_loader,
)


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


def checkpoint_filter(module: nn.Module, base: str) -> Callable | None:
    """timm's ``checkpoint_filter_fn`` for ``module`` (converts original DINOv2/OpenAI/open_clip
    key names and resamples position embeddings to the built size), if its family has one."""
    import sys

    from timm.models import _registry

    names = [type(module).__module__]
    family = _registry._model_to_module.get(base)
    if family:
        names.append(f"timm.models.{family}")
    for module_name in names:
        fn = getattr(sys.modules.get(module_name), "checkpoint_filter_fn", None)
        if callable(fn):
            return fn
    return None


def load_timm_weights(
    module: nn.Module,
    base: str,
    path: str | os.PathLike,
    what: str,
    fix_head: Callable[[int], str] | None = None,
) -> None:
    """Read ``path`` safely, convert it with timm's checkpoint filter, load it strictly.

    Unlike timm's ``pretrained_cfg_overlay=dict(file=...)`` this never drops the classifier when
    the class count differs from the architecture's default and never loads non-strictly: every
    parameter comes from the file or the load is a :class:`WeightsError` naming the keys. A
    module built for an input size its patches do not tile is refused first, naming the size
    (not the file)."""
    check_built_size(module, what)
    state = read_state_dict(path)
    fn = checkpoint_filter(module, base)
    if fn is not None:
        try:
            try:
                state = fn(state, module)
            except TypeError:  # older filters take the state dict only
                state = fn(state)
        except Exception as e:
            first = " ".join(str(e).split())[:200]
            raise WeightsError(
                f"the weights in {str(path)!r} do not fit {what}: timm's checkpoint filter "
                f"could not convert them ({type(e).__name__}: {first}); the file belongs to "
                "another architecture or other constructor arguments (check width, depth, patch "
                "size, registers and img_size)"
            ) from None
    load_strict(module, state, path, what, fix_head or (lambda n: f"pass num_classes={n}"))


def _create(name: str, **kwargs: Any) -> nn.Module:
    import timm

    return timm.create_model(name, **kwargs)


@register_loader("timm")
def load_timm(
    name: str, pretrained: bool = True, weights: str | os.PathLike | None = None, **kwargs: Any
) -> Loaded:
    """Build ``name`` with timm; weights from the hub, from ``weights`` (through timm's
    checkpoint filter, so original DINOv2/OpenAI files convert, then loaded strictly: a file
    with a 512-class head needs ``num_classes=512``), or none."""
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
        module = _create(name, pretrained=False, **kwargs)  # wrong arguments raise TypeError
        load_timm_weights(module, base, weights, f"{name} (as built with {kwargs or 'defaults'})")
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
