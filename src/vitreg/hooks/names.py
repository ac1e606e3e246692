"""Canonical hook names: the per-block site vocabulary and :func:`hook_name`.

Plain ViTs (timm, Eva, HF, open_clip) name block ``i``'s sites ``blocks.{i}.{site}`` with ``site``
one of :data:`BLOCK_SITES`; ``hook_embed``, ``hook_tokens`` and ``ln_final.hook_out`` sit outside
the blocks. Hierarchical models (Swin, PVT-v2) use ``stages.{s}.blocks.{j}.{site}`` with the same
site suffixes; see ``model.hook_names()``.
"""

from __future__ import annotations

import difflib
import operator

from vitreg.errors import HookError, InputError

BLOCK_SITES: tuple[str, ...] = (
    "hook_resid_pre",
    "ln1.hook_in",
    "ln1.hook_out",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_pattern",
    "hook_resid_mid",
    "ln2.hook_out",
    "mlp.hook_post",
    "hook_resid_post",
)
"""The sites of one block, in forward order (the suffix after ``blocks.{i}.``)."""


def hook_name(layer: int, site: str) -> str:
    """The canonical name of ``site`` in block ``layer``: ``hook_name(3, "mlp.hook_post")`` is
    ``"blocks.3.mlp.hook_post"``.

    ``site`` must be one of :data:`BLOCK_SITES` (a :class:`HookError` suggests the closest);
    ``layer`` a block index >= 0 (:class:`InputError` otherwise). Whether the model has that
    block is checked where the name is used (``model.site``, ``model.hooks``).
    """
    try:
        index = operator.index(layer)  # ints, numpy and 0-d torch integers
    except TypeError:
        index = -1
    if isinstance(layer, bool) or index < 0:
        raise InputError(f"hook_name takes a block index >= 0, got {layer!r}")
    if site not in BLOCK_SITES:
        close = difflib.get_close_matches(str(site), BLOCK_SITES, n=3)
        hint = f"; did you mean {close}?" if close else f"; block sites are {BLOCK_SITES}"
        raise HookError(f"{site!r} is not a block hook site{hint}")
    return f"blocks.{index}.{site}"
