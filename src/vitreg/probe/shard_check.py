"""Whether a shard's metadata and tensors are what :class:`~vitreg.probe.shards.ShardWriter`
writes: a shard whose checksum holds can still be forged (a hand-made file with its own valid
checksum), so every field is checked for its type and its agreement with the tensors before
anything is read from it."""

from __future__ import annotations

import json

MALFORMED = "malformed metadata"
MISMATCHED = "tensors do not match the metadata"
LAYOUT_FIELDS = ("n_cls", "n_reg", "grid", "patch_size", "n_extra")


class _Bad(Exception):
    """One check failed; the reason is the class of failure."""


def _int(text: str | None) -> int:
    if text is None or not text.isdigit() or len(text) > 18:
        raise _Bad(MALFORMED)
    return int(text)


def _json(text: str | None) -> object:
    if text is None or len(text) > 2**26:
        raise _Bad(MALFORMED)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise _Bad(MALFORMED) from None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def _pair(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_count(v) for v in value)


def _check_layouts(layouts: object) -> None:
    """Each hook's layout holds non-negative integer counts and two-element grids."""
    if not isinstance(layouts, dict):
        raise _Bad(MALFORMED)
    for layout in layouts.values():
        if not isinstance(layout, dict) or any(f not in layout for f in LAYOUT_FIELDS):
            raise _Bad(MALFORMED)
        if not all(_count(layout[f]) for f in ("n_cls", "n_reg", "n_extra")):
            raise _Bad(MALFORMED)
        if not (_pair(layout["grid"]) and _pair(layout["patch_size"])):
            raise _Bad(MALFORMED)


def _check_lists(meta: dict[str, str], n: int, span: int) -> None:
    """Keys, skipped samples, repairs and boxes: the types the writer gives them, as many as
    the shard holds."""
    keys = _json(meta.get("keys"))
    if not isinstance(keys, list) or len(keys) != n or not all(isinstance(k, str) for k in keys):
        raise _Bad(MALFORMED)
    skipped = _json(meta.get("skipped"))
    if not isinstance(skipped, list) or len(skipped) != span - n:
        raise _Bad(MALFORMED)
    if not all(isinstance(s, dict) and isinstance(s.get("reason"), str) for s in skipped):
        raise _Bad(MALFORMED)
    repairs = _json(meta.get("repairs", "{}"))
    if not isinstance(repairs, dict) or not all(_count(v) for v in repairs.values()):
        raise _Bad(MALFORMED)
    boxes = _json(meta.get("boxes", "null"))
    if boxes is not None and not (isinstance(boxes, list) and len(boxes) == n):
        raise _Bad(MALFORMED)
    for per_sample in boxes or []:
        if not isinstance(per_sample, list) or not all(
            isinstance(b, list)
            and len(b) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in b)
            for b in per_sample
        ):
            raise _Bad(MALFORMED)


def meta_problem(
    meta: dict[str, str], shapes: dict[str, list[int]], start: int, stop: int
) -> str | None:
    """Why a shard meant to hold samples ``start..stop`` is not one the writer made
    (:data:`MALFORMED` or :data:`MISMATCHED`), or None. ``shapes``: its tensors' shapes."""
    try:
        if (_int(meta.get("start")), _int(meta.get("stop"))) != (start, stop):
            raise _Bad(MALFORMED)
        n = _int(meta.get("n"))
        if n > stop - start:
            raise _Bad(MALFORMED)
        _check_lists(meta, n, stop - start)
        _check_layouts(_json(meta.get("layouts")))
        if n and not shapes:
            raise _Bad(MISMATCHED)
        if any(not shape or shape[0] != n for shape in shapes.values()):
            raise _Bad(MISMATCHED)
    except _Bad as e:
        return str(e)
    return None
