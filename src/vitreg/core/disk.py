"""The one low writer of every file vitreg writes (run files, feature caches, checkpoints, the
schema, the run manifest): a file appears whole or not at all, and a failing disk (full,
read-only, not permitted) is a :class:`~vitreg.errors.WriteError` naming the path and the free
space, never a traceback; files finished before it are kept."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from vitreg.errors import WriteError

# what each failure of a disk means for the user, and what to do about it
_FULL = ("the disk is full", "free some space or pass a folder on another disk")
_READ_ONLY = ("the file system is read-only", "pass a folder on a writable disk")
_DENIED = ("permission denied", "pass a folder you may write to")
_CAUSES = {
    errno.ENOSPC: _FULL,
    errno.EDQUOT: ("the disk quota is used up", _FULL[1]),
    errno.EFBIG: ("the file is larger than the file system allows", _FULL[1]),
    errno.EROFS: _READ_ONLY,
    errno.EACCES: _DENIED,
    errno.EPERM: _DENIED,
}


def free_space(path: str | Path) -> str:
    """The free space of the disk holding ``path`` (its nearest existing folder), as text."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return "free space unknown"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if free < 1024 or unit == "GiB":
            return f"{free:,} bytes free" if unit == "bytes" else f"{free:.1f} {unit} free"
        free /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def failing_disk(e: OSError) -> bool:
    """Whether ``e`` says the disk is full, read-only or not permitted."""
    return e.errno in _CAUSES


def write_error(e: OSError, path: str | Path) -> WriteError:
    """The :class:`WriteError` for ``e``, raised while writing ``path``."""
    cause, advice = _CAUSES.get(e.errno or 0, (e.strerror or str(e), "pass another folder"))
    return WriteError(
        f"could not write {str(path)!r}: {cause} ({free_space(path)} on its disk); {advice}. "
        "The files vitreg finished before it are kept",
        errno=e.errno,
    )


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an :class:`OSError` raised inside into the :class:`WriteError` of ``path``."""
    try:
        yield
    except OSError as e:
        raise write_error(e, path) from None


def _write_all(f: IO[bytes], data: bytes) -> None:
    """The low write (one place, so that tests can make the disk fail)."""
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def replace_atomic(
    target: str | Path, data: bytes, before: Callable[[], None] | None = None
) -> Path:
    """Write ``data`` to a temporary file beside ``target``, fsync it, call ``before`` (the data
    is on disk, not yet in place), then rename it over ``target``; a failing disk is a
    :class:`WriteError` and leaves no temporary file."""
    target = Path(target)
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o644)  # mkstemp makes 0600; runs are meant to be shared
                _write_all(f, data)
            if before is not None:
                before()
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return target


def remove_file(path: str | Path) -> None:
    """Delete ``path`` if it is there; a failing disk is a :class:`WriteError`."""
    with writing(path):
        Path(path).unlink(missing_ok=True)
