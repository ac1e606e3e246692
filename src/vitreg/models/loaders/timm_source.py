"""``timm:NAME[.tag]``: timm's registry, hub weights, or a local weights file (timm's filters, strict)."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitreg.errors import SpecError, WeightsError
from vitreg.models.input_size import MAX_IMG_SIZE, check_built_size
from vitreg.models.load import (
    Loaded,
    load_strict,
    offline_hint,
    read_state_dict,
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


def did_you_mean(base: str) -> str:
    """The tail of an unknown-architecture error: up to 3 close timm model names, else a hint."""
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


def built_grid(module: nn.Module) -> tuple[int, int] | None:
    """The patch grid a timm ViT's absolute position embedding is built for (None: it has none)."""
    grid = getattr(getattr(module, "patch_embed", None), "grid_size", None)
    pos = getattr(module, "pos_embed", None)
    if grid is None or not isinstance(pos, torch.Tensor) or pos.ndim != 3:
        return None
    return int(grid[0]), int(grid[1])


def file_grid(state: dict[str, torch.Tensor], module: nn.Module) -> tuple[int, int] | None:
    """The square patch grid of the file's ``pos_embed`` ([1, N, C], N = prefix + h*w; the
    prefix tried first is the module's own), or None when the file has none to read."""
    pos, own = state.get("pos_embed"), built_grid(module)
    if own is None or not isinstance(pos, torch.Tensor) or pos.ndim != 3:
        return None
    prefix = int(module.pos_embed.shape[1]) - own[0] * own[1]
    for p in dict.fromkeys((prefix, 1, 0)):
        side = math.isqrt(max(int(pos.shape[1]) - p, 0))
        if side > 0 and side * side == int(pos.shape[1]) - p:
            return side, side
    return None


def _shown(grid: tuple[int, int]) -> str:
    return f"{grid[0]}x{grid[1]}"


def size_from_weights(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    kwargs: dict,
    build: Callable[..., nn.Module],
    path: str | os.PathLike,
) -> tuple[nn.Module, list[str]]:
    """``module`` rebuilt for the input size of the file's position-embedding grid when the
    caller named no size (``img_size``/``dynamic_img_size``) and the grids differ, with a note
    naming both sizes and ``--img-size``; otherwise ``module`` unchanged."""
    grid, own = file_grid(state, module), built_grid(module)
    if grid is None or grid == own or {"img_size", "dynamic_img_size"} & set(kwargs):
        return module, []
    patch = tuple(int(p) for p in module.patch_embed.patch_size)
    size = (grid[0] * patch[0], grid[1] * patch[1])
    default = (own[0] * patch[0], own[1] * patch[1])
    if max(size) > MAX_IMG_SIZE:
        raise WeightsError(
            f"the position embedding in {str(path)!r} is a {_shown(grid)} grid, an input of "
            f"{size[0]}x{size[1]} px, above the {MAX_IMG_SIZE} px vitreg builds; pass --img-size "
            "(img_size= in vitreg.load) with the size the weights were made for"
        )
    note = (
        f"input size {size[0]}x{size[1]} px taken from the weights file {str(path)!r}: its "
        f"position embedding is a {_shown(grid)} grid of {patch[0]} px patches (the "
        f"architecture's default is {default[0]}x{default[1]} px); pass --img-size (img_size= "
        "in vitreg.load) for another size, and the position embedding is then resampled"
    )
    return build(img_size=size[0] if size[0] == size[1] else size), [note]


def load_timm_weights(
    module: nn.Module,
    base: str,
    path: str | os.PathLike,
    what: str,
    fix_head: Callable[[int], str] | None = None,
    state: dict[str, torch.Tensor] | None = None,
) -> list[str]:
    """Read ``path`` safely (or take its ``state``, already read), convert it with timm's
    checkpoint filter, load it strictly; returns the notes on what the filter changed.

    Unlike timm's ``pretrained_cfg_overlay=dict(file=...)`` this never drops the classifier when
    the class count differs from the architecture's default and never loads non-strictly: every
    parameter comes from the file or the load is a :class:`WeightsError` naming the keys. The
    one exception timm's filter makes, a position embedding made for another input size, is
    resampled and announced with both grids. A module built for an input size its patches do
    not tile is refused first, naming the size (not the file)."""
    check_built_size(module, what)
    if state is None:
        state = read_state_dict(path)
    grid, own = file_grid(state, module), built_grid(module)
    notes = []
    if grid is not None and grid != own:
        notes.append(
            f"position embedding resampled from {_shown(grid)} to {_shown(own)}: the weights "
            f"in {str(path)!r} were made for another input size than the model is built for; "
            "every other parameter is loaded as saved, this one is interpolated (timm's "
            "checkpoint filter), so it is not the trained one. Pass --img-size to match the "
            "weights"
        )
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
    return notes


def _create(name: str, **kwargs: Any) -> nn.Module:
    import timm

    return timm.create_model(name, **kwargs)


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
        raise SpecError(f"timm has no model named {base!r}{did_you_mean(base)}")
    if tag and name not in timm.list_pretrained(f"{base}.*"):
        tags = [n.split(".", 1)[1] for n in timm.list_pretrained(f"{base}.*")]
        raise SpecError(f"timm has no weights tagged {tag!r} for {base}; tags: {tags}")
    notes = timm_notes(name, pretrained or weights is not None, kwargs)
    if weights is not None:
        module = _create(name, pretrained=False, **kwargs)  # wrong arguments raise TypeError
        state = read_state_dict(weights)
        module, sized = size_from_weights(
            module,
            state,
            kwargs,
            lambda **kw: _create(name, pretrained=False, **kwargs, **kw),
            weights,
        )
        if sized:  # the size came from the file: the default-size note no longer applies
            notes = timm_notes(name, True, {**kwargs, "img_size": None})
        what = f"{name} (as built with {kwargs or 'defaults'})"
        notes += sized + load_timm_weights(module, base, weights, what, state=state)
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
