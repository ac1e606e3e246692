"""Reading a result document's fields in a renderer: any field the schema leaves open may be
missing, None, NaN or empty (no outlier patches, one image, no [CLS], a skipped analysis), and a
report must still render. One getter and two guards instead of a ``.get(k) or {}`` per read."""

from __future__ import annotations

from typing import Any


def dig(node: Any, *path: str | int) -> Any:
    """``node[path[0]][path[1]]...``, or None where a step is missing, None or not a container
    (a negative index counts from the end, as in Python)."""
    for key in path:
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
            node = node[key]
        else:
            return None
    return node


def as_dict(x: Any) -> dict[str, Any]:
    """``x`` if it is a dict, else an empty one (a summary of nothing: None)."""
    return x if isinstance(x, dict) else {}


def as_list(x: Any) -> list[Any]:
    """``x`` if it is a list, else an empty one."""
    return x if isinstance(x, list) else []
