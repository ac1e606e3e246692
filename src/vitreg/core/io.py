"""Atomic file writes: a reader (or an interrupted run) never sees a half-written file, and a
run's manifest records what each file holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitreg.core.disk import replace_atomic, writing
from vitreg.core.run_dir import record, seal


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``: listed
    first in the manifest of the claimed run directory holding it (if any), its size and hash
    recorded before it appears. A failing disk is a :class:`~vitreg.errors.WriteError`."""
    target = Path(path)
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
    record(target)  # the run's manifest lists every file it writes
    return replace_atomic(target, data, before=lambda: seal(target, data))


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, default=_jsonable) + "\n")


def _jsonable(obj: Any) -> Any:
    """Tensors/arrays to lists, paths to strings: every number in a report stays traceable."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")
