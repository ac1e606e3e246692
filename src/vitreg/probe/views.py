"""Token views for the feature cache: [CLS], registers, test-time registers and patch summaries.

Every index goes through the hook's :class:`TokenLayout`. The views of one site are packed into
one ``[B, D]`` float32 tensor by the ``reduce`` callable given to ``Model.run_with_cache``, so the
full token tensor of a site is never kept unless the ``patches`` view is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.hooks.sites import HookContext

VIEWS = ("cls", "reg", "extra", "patch_mean", "patch_center", "patch_top", "patches")
PATCH_VIEWS = ("patch_mean", "patch_center", "patch_top", "patches")
# stored next to the views: the norm of every patch, and which patch ``patch_top`` is
NORMS = "patch_norms"
TOP_INDEX = "patch_top_index"


def check_views(views: Sequence[str]) -> list[str]:
    """The requested views, validated and de-duplicated in order."""
    chosen = list(dict.fromkeys(views))
    unknown = [v for v in chosen if v not in VIEWS]
    if unknown or not chosen:
        raise InputError(f"unknown views {unknown or '(none given)'}; choose from {list(VIEWS)}")
    return chosen


def absent_views(layout: TokenLayout, views: Sequence[str]) -> dict[str, str]:
    """Requested views this layout cannot give, each with the reason."""
    reasons = {
        "cls": (layout.n_cls, "this site has no [CLS] token"),
        "reg": (layout.n_reg, "this model has no trained registers"),
        "extra": (layout.n_extra, "no test-time registers: pass a fix that inserts tokens"),
    }
    return {v: reasons[v][1] for v in views if v in reasons and reasons[v][0] == 0}


def as_tokens(t: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """``[B, N, C]`` tokens from a token sequence or a prefix-free stage grid ``[B, h, w, C]``."""
    is_grid = t.dim() == 4 and tuple(t.shape[1:3]) == tuple(layout.grid) and layout.n_prefix == 0
    tokens = t.flatten(1, 2) if is_grid else t
    layout.check(tokens)
    return tokens


def center_index(layout: TokenLayout) -> int:
    """Row-major index of the centre patch of the grid."""
    h, w = layout.grid
    return (h // 2) * w + w // 2


def token_views(
    t: torch.Tensor, layout: TokenLayout, views: Sequence[str]
) -> dict[str, torch.Tensor]:
    """The available ``views`` of one site's tokens (float32), plus norms/top index for patch views."""
    tokens = as_tokens(t, layout).float()
    out: dict[str, torch.Tensor] = {}
    gone = absent_views(layout, views)
    parts = {"cls": "cls", "reg": "registers", "extra": "extra"}
    for v in views:
        if v in parts and v not in gone:
            part = layout.take(tokens, parts[v])
            out[v] = part.squeeze(1) if v == "cls" and layout.n_cls == 1 else part
    if not any(v in PATCH_VIEWS for v in views):
        return out
    patches = layout.take(tokens, "patches")
    norms = patches.norm(dim=-1)
    top = norms.argmax(dim=1)
    rows = torch.arange(patches.shape[0], device=patches.device)
    found = {
        "patch_mean": lambda: patches.mean(1),
        "patch_center": lambda: patches[:, center_index(layout)],
        "patch_top": lambda: patches[rows, top],
        "patches": lambda: patches,
    }
    out.update({v: found[v]() for v in views if v in found})
    out[NORMS] = norms
    if "patch_top" in views:
        out[TOP_INDEX] = top.float()  # packed as float; exact for any realistic patch count
    return out


def pack(parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[tuple[str, tuple[int, ...]]]]:
    """Flatten named ``[B, ...]`` tensors into one ``[B, D]`` tensor and the spec to undo it."""
    spec = [(k, tuple(v.shape[1:])) for k, v in parts.items()]
    b = next(iter(parts.values())).shape[0]
    return torch.cat([v.reshape(b, -1) for v in parts.values()], dim=1), spec


def unpack(
    packed: torch.Tensor, spec: list[tuple[str, tuple[int, ...]]]
) -> dict[str, torch.Tensor]:
    """Undo :func:`pack`: the named tensors back from ``[B, D]``."""
    out, start = {}, 0
    for name, shape in spec:
        size = math.prod(shape)
        # layout: packed feature columns, not tokens
        out[name] = packed[:, start : start + size].reshape(packed.shape[0], *shape)
        start += size
    if TOP_INDEX in out:
        out[TOP_INDEX] = out[TOP_INDEX].round().long()
    return out


def reducer(
    views: Sequence[str], specs: dict[str, list[tuple[str, tuple[int, ...]]]]
) -> Callable[[torch.Tensor, HookContext], torch.Tensor]:
    """A ``run_with_cache`` reduce callable: tokens -> packed views; records each site's spec."""

    def reduce(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
        if hook.layout is None:
            raise InputError(f"{hook.name!r} is not a token sequence; pick a block output")
        packed, specs[hook.name] = pack(token_views(t, hook.layout, views))
        return packed

    return reduce


def patch_pixels(x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """Input pixels under each patch token, ``[B, N, ph * pw * 3]`` (row-major, channel last).

    The image is zero-padded (or cropped) to ``grid * patch_size`` first, as padding models do.
    """
    (h, w), (ph, pw) = layout.grid, layout.patch_size
    b, c = x.shape[:2]
    canvas = x.new_zeros(b, c, h * ph, w * pw)
    hh, ww = min(h * ph, x.shape[2]), min(w * pw, x.shape[3])
    canvas[:, :, :hh, :ww] = x[:, :, :hh, :ww]
    grid = canvas.reshape(b, c, h, ph, w, pw).permute(0, 2, 4, 3, 5, 1)
    return grid.reshape(b, h * w, ph * pw * c)
