"""The input size a model is built for, checked before anything is allocated or run: within
:data:`MAX_IMG_SIZE` before the build, then (the build done, no weights read, no image run) a
whole number of patches per side, at least :data:`MIN_GRID` of them, and one image's
activations within :data:`MAX_ACTIVATION_BYTES`. Errors name ``--img-size``, the option that sets the size."""

from __future__ import annotations

from typing import Any

from torch import nn

from vitreg.core.choices import MAX_IMG_SIZE
from vitreg.errors import InputError

MIN_GRID = 2  # patches per side: outliers are patches that stand out from other patches
MAX_ACTIVATION_BYTES = 16 * 2**30  # one image through one block: attention maps + MLP
SIZE_KWARGS = ("img_size", "image_size", "force_image_size")  # timm / HF / open_clip


def _sides(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_requested_size(kwargs: dict[str, Any]) -> None:
    """Refuse a requested input size that is not a positive integer up to MAX_IMG_SIZE (a
    100000 px ViT would allocate tens of GB for its position embedding alone)."""
    for key in SIZE_KWARGS:
        if kwargs.get(key) is None:
            continue
        for side in _sides(kwargs[key]):
            if isinstance(side, bool) or not isinstance(side, int) or not 1 <= side <= MAX_IMG_SIZE:
                raise InputError(
                    f"--img-size {kwargs[key]!r} ({key}={kwargs[key]!r}): the input size must be "
                    f"a whole number of pixels from 1 to {MAX_IMG_SIZE}; ViTs take 224 or 518, "
                    "or a multiple of their patch size near it"
                )


def activation_excess(module: nn.Module) -> str | None:
    """Why one image is too large for a timm-style ViT (its attention maps and MLP activations
    in one block, float32, above MAX_ACTIVATION_BYTES), read off the built module (the meta
    device will do); None when it fits or the module does not say."""
    patches = getattr(getattr(module, "patch_embed", None), "num_patches", None)
    blocks = getattr(module, "blocks", None)
    heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None) if blocks else None
    if not isinstance(patches, int) or not isinstance(heads, int):
        return None
    # layout: a size estimate of the built module, before any TokenLayout exists
    tokens = patches + int(getattr(module, "num_prefix_tokens", 0) or 0)
    width = int(getattr(module, "embed_dim", 0) or 0)
    need = 4 * (heads * tokens * tokens + 8 * tokens * width)
    if need <= MAX_ACTIVATION_BYTES:
        return None
    return (
        f"gives {tokens} tokens per image, and one image would need about "
        f"{need / 2**30:.0f} GiB of activations ({heads} attention maps of {tokens}x{tokens}), "
        f"above the {MAX_ACTIVATION_BYTES // 2**30} GiB vitreg allows"
    )


def check_built_size(module: nn.Module, what: str) -> None:
    """A timm ViT built for an input its patches do not tile, or whose one image would need
    more than MAX_ACTIVATION_BYTES, is refused before its weights are read or any image runs."""
    from timm.layers import PatchEmbed

    embed = getattr(module, "patch_embed", None)
    if not isinstance(embed, PatchEmbed) or embed.img_size is None:
        return  # other sources check sizes themselves; dynamic models take any size
    size, patch = tuple(embed.img_size), tuple(embed.patch_size)
    shown = size[0] if size[0] == size[1] else size
    if not getattr(embed, "dynamic_img_pad", False) and any(
        s < p or s % p for s, p in zip(size, patch, strict=True)
    ):
        p = patch[0]
        near = max(MIN_GRID, round(size[0] / p)) * p
        raise InputError(
            f"--img-size {shown} (img_size={shown}) does not fit {what}: its patches are "
            f"{patch[0]}x{patch[1]} pixels, and an input side must be a whole number of patches; "
            f"pass a multiple of {p} (e.g. {near})"
        )
    if min(s // p for s, p in zip(size, patch, strict=True)) < MIN_GRID:
        grid = "x".join(str(s // p) for s, p in zip(size, patch, strict=True))
        raise InputError(
            f"--img-size {shown} (img_size={shown}) gives {what} a {grid} grid of "
            f"{patch[0]}x{patch[1]}-pixel patches; vitreg needs at least {MIN_GRID}x{MIN_GRID} "
            f"patches (an artifact is a patch that stands out from the others): pass at least "
            f"{MIN_GRID * max(patch)}"
        )
    excess = activation_excess(module)
    if excess is not None:
        raise InputError(
            f"--img-size {shown} (img_size={shown}) for {what} {excess}; pass a smaller --img-size"
        )


def check_grid(grid: Any, what: str, img_size: Any = None) -> None:
    """A wrapped model (any source) whose patch grid has fewer than :data:`MIN_GRID` patches a
    side is refused before it runs: the check of :func:`check_built_size` for sources that are
    not timm ViTs."""
    sides = [g for g in (grid or ()) if isinstance(g, int)]
    if sides and min(sides) < MIN_GRID:
        size = f"--img-size {img_size} " if img_size is not None else "its input size "
        raise InputError(
            f"{size}gives {what} a {'x'.join(map(str, sides))} grid of patches; vitreg needs at "
            f"least {MIN_GRID}x{MIN_GRID} patches (an artifact is a patch that stands out from "
            "the others): pass a larger --img-size"
        )


def enable_dynamic_size(model: nn.Module) -> None:
    """Let a timm ViT take any multiple of its patch size (pos-embed interpolation), as
    ``dynamic_img_size=True`` at construction would: DINO's smaller local crops, and checking
    a neuron set at other sizes. At the built size the outputs are unchanged."""
    from timm.layers import Format

    pe = model.patch_embed
    model.dynamic_img_size = True
    pe.strict_img_size = False
    pe.flatten = False
    pe.output_fmt = Format.NHWC
