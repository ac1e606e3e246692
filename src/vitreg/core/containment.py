"""One containment rule for every folder a user names (a ``local:`` or ``hf-vlm:`` model, an image
folder, a feature cache, a run directory): a path inside it is read only if it resolves, links
followed, inside the folder's own resolved path. A link or ``..`` that leads elsewhere is never
read: callers skip it with a counted reason (images) or refuse it with :func:`check_inside`."""

from __future__ import annotations

import os
from pathlib import Path

from vitreg.errors import InputError

MAX_ENTRIES = 100_000  # entries :func:`check_folder` examines; model folders hold a few dozen


def outside(folder: str | Path, path: str | Path) -> str | None:
    """Where ``path`` leads when that is outside ``folder`` (or why it cannot be resolved);
    ``None`` when it resolves inside ``folder`` (the folder itself counts as inside)."""
    try:
        root = os.path.realpath(folder, strict=True)
        try:
            target = os.path.realpath(path, strict=True)
        except FileNotFoundError:  # not there (yet), or a dangling link: where it points
            target = os.path.realpath(path, strict=False)
    except (OSError, RuntimeError) as e:  # a link loop, an unreadable folder
        return f"a path that cannot be resolved ({e.strerror or e})"
    if target == root or target.startswith(root.rstrip(os.sep) + os.sep):
        return None
    return target


def check_inside(folder: str | Path, path: str | Path, what: str) -> Path:
    """``path`` if it resolves inside ``folder``; else an :class:`InputError` naming ``what``, the
    path, where it leads and the folder."""
    elsewhere = outside(folder, path)
    if elsewhere is not None:
        raise InputError(
            f"{what} {str(path)!r} leads (through a link or '..') to {elsewhere!r}, outside the "
            f"folder {str(folder)!r}; vitreg reads nothing outside a folder it is given: copy the "
            "file into the folder instead of linking it"
        )
    return Path(path)


def check_folder(folder: str | Path, what: str) -> None:
    """Every entry under ``folder`` (links not descended) resolves inside it, so that a library
    reading any file of the folder by name (transformers, timm) never leaves it; an
    :class:`InputError` naming the first entry that does not, or a folder of more than
    :data:`MAX_ENTRIES` entries."""
    seen = 0
    for top, dirs, files in os.walk(folder, followlinks=False):
        for name in (*dirs, *files):
            seen += 1
            if seen > MAX_ENTRIES:
                raise InputError(
                    f"{what} {str(folder)!r} holds more than {MAX_ENTRIES:,} entries; a model "
                    "folder holds a few dozen, so this is not one"
                )
            check_inside(folder, os.path.join(top, name), f"{what} entry")
