"""Run directories vitreg owns: a run writes into ``--out`` only under an exclusive lock, and a
manifest records every file it wrote and what it held, so that nothing it did not write is ever
replaced, mixed with or removed.

- ``.vitreg-manifest.json`` (:mod:`vitreg.core.manifest`) names the verb, the model, the state
  (``running`` while the run goes, ``complete`` or ``incomplete`` when it ends; a killed run
  stays ``running``) and every file written, listed before the file appears (:func:`record`)
  and recorded with its size and sha256 before it replaces anything (:func:`seal`, called by
  the atomic writers; :func:`seal_append` for a log that grows).
- ``.vitreg-lock`` is held (``flock``) for the whole run and names its pid, host and start time;
  a second run into the folder is refused naming the first. A lock left by a dead process on
  this host is taken over.
- A folder holding anything the manifest does not list (the user's own files, links, another
  tool's output) is refused, with ``overwrite`` or not: vitreg writes only into a new, empty or
  vitreg-owned folder. ``overwrite`` removes exactly the manifest's files (never through a
  link), and the partial files of a run that did not finish are refused until it does.
- A listed file counts as the run's only while it still holds what was recorded: one changed
  since, or listed without a record (an older vitreg's run, a forged manifest), is named and
  the folder refused, with ``overwrite`` or ``resume``; nothing is removed on the manifest's
  word alone.
- A resumable verb (``train``, ``experiment``) on the same model continues its own run.

Claims end when the verb returns (:class:`session`, a decorator on each verb): the lock is
released and the state set; a run that wrote nothing leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vitreg.core.disk import failing_disk, replace_atomic, write_error, writing
from vitreg.core.manifest import (
    LOCK,
    MANIFEST,
    OWN,
    Digest,
    Manifest,
    Record,
    document,
    read_manifest,
    unproven,
)
from vitreg.errors import InputError, WriteError, brief

__all__ = [
    "LOCK",
    "MANIFEST",
    "Run",
    "claim",
    "finish",
    "record",
    "reopen",
    "seal",
    "seal_append",
    "session",
]

MAX_ENTRIES = 1_000_000  # entries examined in one --out; runs write a few hundred
SHOWN = 5  # foreign entries named in a message


@dataclass
class Run:
    """A claimed run directory: where, what writes it, the files written, the held lock."""

    out: Path
    root: str  # the resolved folder, which recorded paths are relative to
    verb: str
    model: str | None
    lock: int  # the descriptor holding the flock
    files: set[str] = field(default_factory=set)
    records: dict[str, Record] = field(default_factory=dict)  # what each file held when written
    appends: dict[str, Digest] = field(default_factory=dict)  # running hashes of appended files
    made: list[Path] = field(default_factory=list)  # folders the claim created
    started: str = ""
    kept_state: str | None = None  # a reopened run keeps its state
    owned: bool = True  # False: a folder vitreg keeps no manifest of (only locked)


_ACTIVE: list[Run] = []


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _shown(value: Any, limit: int) -> str:
    """A value from a file as message text: a string cut to ``limit`` characters, on one line;
    anything else as :func:`~vitreg.errors.brief` shows it."""
    if not isinstance(value, str):
        return brief(value, limit)
    text = " ".join(value.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _holder(fd: int) -> dict[str, Any]:
    """What the lock file behind ``fd`` says about the run holding it ({} when unreadable)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    parts = [f"pid {_shown(holder.get('pid'), 20)} on {_shown(holder.get('host'), 60)}"]
    if holder.get("started"):
        parts.append(f"started {_shown(holder.get('started'), 40)}")
    if holder.get("verb"):
        parts.append(f"`vitreg {_shown(holder.get('verb'), 20)}`")
    return ", ".join(parts)


def _lock(out: Path, verb: str) -> int:
    """An exclusive lock on ``out`` (its descriptor), or an :class:`InputError` naming the run
    that holds it. A lock file left by a dead process on this host is taken over."""
    path = out / LOCK
    for _ in range(8):  # a run releasing its lock unlinks the file: lock the one at the path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if failing_disk(e):
                raise write_error(e, path) from None
            raise InputError(
                f"--out {str(out)!r}: its lock file {LOCK} cannot be opened ({e.strerror or e}; "
                "a link is refused); pass a folder you can write to"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise InputError(
                f"--out {str(out)!r} is in use by another vitreg run ({_describe(holder)}); "
                "wait for it to finish, or pass another --out"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.lstat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        holder = _holder(fd)
        if holder.get("host") not in (None, socket.gethostname()):
            os.close(fd)
            raise InputError(
                f"--out {str(out)!r} is locked by a vitreg run on another machine "
                f"({_describe(holder)}); if that run is gone, delete {str(path)!r}, or pass "
                "another --out"
            )
        # no live holder here: a dead pid's stale lock (or none) is taken over
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**mine, "verb": verb}).encode(), 0)
        return fd
    raise InputError(f"--out {str(out)!r}: its lock keeps changing hands; try again")


def _unlock(run: Run) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run.root, LOCK))  # while still held: a waiter re-checks the file
    os.close(run.lock)


_TEMP = re.compile(r"\.(.+)\.[a-z0-9_]{8}\.tmp")  # mkstemp's name for an atomic write of NAME


def _temp_of(name: str) -> str | None:
    """The file whose atomic write ``name`` is the temporary file of; None if it is none."""
    match = _TEMP.fullmatch(name)
    return match.group(1) if match else None


def _owned(rel: str, files: set[str]) -> bool:
    """Whether ``rel`` is a manifest file or the temporary file of an atomic write of one."""
    if rel in files:
        return True
    parent, _, name = rel.rpartition("/")
    base = _temp_of(name)
    if base is None:
        return False
    return (f"{parent}/{base}" if parent else base) in files or (not parent and base in OWN)


def _foreign(out: Path, files: set[str]) -> list[str]:
    """Every entry under ``out`` vitreg did not write: not in ``files``, or a link (vitreg
    writes plain files; a link is never followed, nor descended)."""
    found, seen = [], 0
    for top, dirs, names in os.walk(out, followlinks=False):
        rel_top = os.path.relpath(top, out)
        for name in (*dirs, *names):
            seen += 1
            if seen > MAX_ENTRIES:
                raise InputError(
                    f"--out {str(out)!r} holds more than {MAX_ENTRIES:,} entries; pass a new "
                    "folder as --out"
                )
            rel = name if rel_top == "." else f"{rel_top}/{name}".replace(os.sep, "/")
            path = os.path.join(top, name)
            if os.path.islink(path):
                found.append(rel)
            elif name in dirs:
                continue  # a folder: its entries are examined
            elif not (rel in OWN or _owned(rel, files)):
                found.append(rel)
    return sorted(found)


def _no_link(out: Path, rel: str) -> Path | None:
    """``out/rel`` when no part of it below ``out`` is a link; None otherwise."""
    path = out
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            return None
    return path


def _plain(out: Path, rel: str) -> Path | None:
    """``out/rel`` when no part of it is a link and it is a plain file; None otherwise."""
    path = _no_link(out, rel)
    return path if path is not None and path.is_file() else None


def _plain_folder(out: Path, rel: str) -> bool:
    path = _no_link(out, rel)
    return path is not None and path.is_dir()


def _remove(out: Path, run: Manifest, files: list[str]) -> None:
    """Delete ``files`` (plain files only, never through a link, each only while it matches its
    record) and the temporary files of their atomic writes, then the folders that leaves empty."""
    by_parent: dict[str, set[str]] = {}
    for rel in files:
        path = _plain(out, rel)
        if path is not None and rel in run.records and run.records[rel].matches(path):
            path.unlink()
        parent, _, name = rel.rpartition("/")
        by_parent.setdefault(parent, set()).add(name)
    for parent, names in by_parent.items():
        if parent == "" or _plain_folder(out, parent):
            for leftover in os.scandir(out / parent):  # names compared, never a pattern
                if _temp_of(leftover.name) in names and leftover.is_file(follow_symlinks=False):
                    os.unlink(leftover.path)
    folders = {p for rel in files for p in (out / rel).parents if p != out and out in p.parents}
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()


def _save(run: Run, state: str) -> None:
    """Write the manifest of ``run`` atomically (a reader never sees half of it)."""
    what = Manifest(run.verb, run.model, state, run.started, sorted(run.files), run.records)
    replace_atomic(Path(run.root, MANIFEST), document(what, os.getpid(), socket.gethostname()))


def _unproven(out: Path, doc: Manifest, names: list[str]) -> str:
    """Why ``out`` is refused: its manifest lists ``names`` but proves none of them."""
    shown = ", ".join(brief(f, 60) for f in names[:SHOWN])
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    why = (
        "its manifest records no content hashes (a run of an older vitreg, or a manifest vitreg "
        "did not write)"
        if not doc.records
        else "they changed after the run wrote them, or its manifest records no hash for them"
    )
    return (
        f"--out {str(out)!r} holds files its manifest lists that vitreg cannot prove it wrote "
        f"({shown}{more}): {why}; vitreg never removes or replaces them: move them out of the "
        "folder (or delete them yourself), or pass another --out"
    )


def _refusal(out: Path, doc: Manifest, verb: str, model: str | None) -> str:
    """Why ``out``, holding the run ``doc``, is refused to a ``verb`` run of ``model``."""
    found = f"`vitreg {_shown(doc.verb, 20)}` run" + (
        f" of {_shown(doc.model, 120)}" if doc.model else ""
    )
    mine = f"`vitreg {verb}` run" + (f" of {model}" if model else "")
    if doc.state != "complete":
        what = (
            f"the partial files of a {found} that did not finish (state "
            f"{_shown(doc.state, 20)}, started {_shown(doc.started, 40)})"
        )
    elif doc.verb == verb and doc.model in (None, model):
        what = "the results of this same command on this model; a rerun would replace them"
    else:
        what = f"a {found}, not a {mine}"
    return (
        f"--out {str(out)!r} already holds {what}; pass another --out, or --overwrite to "
        "remove that run's files first (only the files it wrote)"
    )


def claim(
    out: str | Path, verb: str, model: str | None, overwrite: bool = False, resume: bool = False
) -> Run:
    """Lock ``out`` for a ``verb`` run of ``model`` and start its manifest: a new, empty or
    vitreg-owned folder; an earlier run in it is refused, removed (``overwrite``: only its
    files) or, with ``resume`` and the same verb and model, continued. Raises
    :class:`InputError` saying what to do otherwise."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(
            f"--out {str(out)!r} is a file, not a folder; pass a folder (it is created if missing)"
        )
    made = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = _lock(out, verb)
    except OSError as e:
        _remove_made(made)
        if failing_disk(e):
            raise write_error(e, out) from None
        raise InputError(
            f"--out {str(out)!r} cannot be written ({e.strerror or e}); pass a folder you can "
            "write to"
        ) from None
    except (InputError, WriteError):
        _remove_made(made)
        raise
    run = Run(out, os.path.realpath(out), verb, model, fd, made=made, started=_now())
    try:
        doc = read_manifest(out)
        foreign = _foreign(out, set(doc.files) if doc else set())
        if foreign:
            shown = ", ".join(brief(f, 60) for f in foreign[:SHOWN])
            more = f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN else ""
            raise InputError(
                f"--out {str(out)!r} holds files vitreg did not write ({shown}{more}); vitreg "
                "never replaces, mixes with or removes them, with --overwrite or not: pass a "
                "new or empty folder as --out"
            )
        if doc is not None:
            _take_over(run, doc, overwrite, resume)
        _save(run, "running")
    except BaseException:
        _unlock(run)
        _remove_made(made)
        raise
    _ACTIVE.append(run)
    return run


def _take_over(run: Run, doc: Manifest, overwrite: bool, resume: bool) -> None:
    """Remove (``overwrite``) or continue (``resume``, same verb and model) the earlier run
    ``doc`` in ``run.out``, or refuse; either only when every file of it that is left still
    holds what vitreg wrote."""
    out = run.out
    left = sorted(f for f in doc.files if _plain(out, f) is not None)
    if not left:
        return
    same = doc.verb == run.verb and doc.model in (None, run.model)
    if not (overwrite or (same and resume)):
        raise InputError(_refusal(out, doc, run.verb, run.model))
    doubtful = unproven(out, doc, left)
    if doubtful:
        raise InputError(_unproven(out, doc, doubtful))
    if overwrite:
        _remove(out, doc, doc.files)
    else:
        run.files = set(left)
        run.records = {f: doc.records[f] for f in left}


def reopen(folder: str | Path) -> Run:
    """Lock a run directory to add files to it (a report rendered again): its manifest keeps
    its verb, model and state and records the new files. A folder without a manifest (written
    by the library's writers, not a verb) is only locked: vitreg does not own it, so a verb
    refuses it as ``--out`` later."""
    folder = Path(folder)
    fd = _lock(folder, "report")
    run = Run(folder, os.path.realpath(folder), "", None, fd)
    try:
        doc = read_manifest(folder)
        if doc is None:
            run.owned = False
            _ACTIVE.append(run)
            return run
        run.verb, run.model, run.kept_state = doc.verb, doc.model, doc.state
        run.started, run.files, run.records = doc.started, set(doc.files), doc.records
        foreign = _foreign(folder, run.files)
        if foreign:
            raise InputError(
                f"{str(folder)!r} also holds files vitreg did not write ({brief(foreign[0], 60)}"
                "...); vitreg writes nothing into it: move them out first"
            )
    except BaseException:
        _unlock(run)
        raise
    _ACTIVE.append(run)
    return run


def _holding(path: str | Path) -> tuple[Run, str] | None:
    """The claimed run that owns ``path`` (its innermost one) and the path relative to it."""
    absolute = os.path.abspath(path)
    full = os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))
    for run in reversed(_ACTIVE):
        if full.startswith(run.root + os.sep):
            rel = os.path.relpath(full, run.root).replace(os.sep, "/")
            return (run, rel) if run.owned and rel not in OWN else None
    return None


def record(path: str | Path) -> None:
    """Add ``path`` to the manifest of the claimed run holding it, before it is written (so a
    killed run's partial files are listed); nothing when no claimed run holds it."""
    held = _holding(path) if _ACTIVE else None
    if held is not None and held[1] not in held[0].files:
        run, rel = held
        run.files.add(rel)
        _save(run, run.kept_state or "running")


def seal(path: str | Path, data: bytes | None = None) -> None:
    """Record what ``path`` holds (``data``, about to replace it, or the file as it is now) in
    the manifest of the claimed run holding it, so that only that content counts as the run's
    own later; nothing when no claimed run holds it."""
    held = _holding(path) if _ACTIVE else None
    if held is not None:
        run, rel = held
        run.files.add(rel)
        run.records[rel] = Record.of_bytes(data) if data is not None else Record.of_file(Path(path))
        run.appends.pop(rel, None)
        _save(run, run.kept_state or "running")


def seal_append(path: str | Path, data: bytes) -> None:
    """Record ``path`` after ``data`` was appended to it, as :func:`seal` does; the hash is
    carried on from this run's last append (the file is read whole only when it is not)."""
    held = _holding(path) if _ACTIVE else None
    if held is not None:
        run, rel = held
        run.files.add(rel)
        digest = run.appends.get(rel)
        if digest is not None and digest.size + len(data) == os.stat(path).st_size:
            digest.add(data)
        else:
            digest = run.appends[rel] = Digest.of_file(Path(path))
        run.records[rel] = digest.record
        _save(run, run.kept_state or "running")


def finish(run: Run, ok: bool) -> None:
    """End ``run``: its state set (``complete`` when ``ok``), its lock released; a run that
    wrote nothing leaves nothing behind (not even the folders its claim made). A run that
    failed keeps its own error when its manifest cannot be written either."""
    if run in _ACTIVE:
        _ACTIVE.remove(run)
    try:
        with writing(Path(run.root, MANIFEST)):
            if run.files:
                _save(run, run.kept_state or ("complete" if ok else "incomplete"))
            elif run.owned:
                Path(run.root, MANIFEST).unlink(missing_ok=True)
    except WriteError:
        if ok:
            raise
    finally:
        _unlock(run)
    if not run.files:
        _remove_made(run.made)


def _remove_made(made: list[Path]) -> None:
    for folder in made:  # innermost first
        with contextlib.suppress(OSError):
            folder.rmdir()


class session(contextlib.ContextDecorator):  # noqa: N801  # used as @session() on each verb
    """Ends every run claimed inside it when it exits: ``complete`` on a normal return,
    ``incomplete`` on an exception (an interrupt included), the lock released either way."""

    def _recreate_cm(self) -> session:
        return session()  # one mark per call, so that nested or repeated calls stay apart

    def __enter__(self) -> session:
        self.mark = len(_ACTIVE)
        return self

    def __exit__(self, kind: Any, *_: Any) -> bool:
        for run in reversed(_ACTIVE[self.mark :]):
            finish(run, ok=kind is None)
        return False
