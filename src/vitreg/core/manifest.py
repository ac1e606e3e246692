"""The manifest of a run directory, ``.vitreg-manifest.json``: what wrote the folder and, for
every file it wrote, its size and content hash (sha256), the manifest carrying its own hash.

The manifest proves ownership, it does not claim it: a file counts as vitreg's only while its
content still matches its record (:func:`unproven` names the others). Reading is bounded: the
file's size is checked before it is parsed, its entries counted, and each entry must be a plain
relative name inside the folder (never a glob pattern, ``..``, an absolute path or a control
character), so that a forged manifest is an :class:`~vitreg.errors.InputError`, never a hang or
a crash.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hashlib import _Hash

from vitreg.core.readers import read_json
from vitreg.errors import InputError, brief

MANIFEST = ".vitreg-manifest.json"
LOCK = ".vitreg-lock"
OWN = (MANIFEST, LOCK)
VERSION = 2  # manifests of version 1 hold no content hashes
MAX_FILES = 20_000  # files one manifest lists; runs write a few hundred
MAX_BYTES = 8 * 2**20  # its size on disk, checked before it is parsed
MAX_NAME = 1024  # characters of one entry; a part of it at most 255 bytes
_CHUNK = 2**20
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Record:
    """What a file held when vitreg wrote it."""

    size: int
    sha256: str

    @classmethod
    def of_bytes(cls, data: bytes) -> Record:
        return cls(len(data), hashlib.sha256(data).hexdigest())

    @classmethod
    def of_file(cls, path: Path) -> Record:
        """The record of the file at ``path`` as it is now (read in chunks)."""
        return Digest.of_file(path).record

    def matches(self, path: Path) -> bool:
        """Whether the plain file at ``path`` still holds what was recorded (size first)."""
        try:
            return path.stat().st_size == self.size and Record.of_file(path) == self
        except OSError:
            return False


@dataclass
class Digest:
    """The running hash of a file that grows by appending: its record after each append,
    without reading the file again."""

    hasher: _Hash
    size: int

    @classmethod
    def of_file(cls, path: Path) -> Digest:
        h, size = hashlib.sha256(), 0
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
        return cls(h, size)

    def add(self, data: bytes) -> None:
        self.hasher.update(data)
        self.size += len(data)

    @property
    def record(self) -> Record:
        return Record(self.size, self.hasher.hexdigest())


@dataclass
class Manifest:
    """A checked manifest: the run that wrote the folder and the files it wrote."""

    verb: str
    model: str | None
    state: str
    started: str = ""
    files: list[str] = field(default_factory=list)
    records: dict[str, Record] = field(default_factory=dict)


def _self_hash(doc: dict[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def document(run: Manifest, pid: int, host: str) -> bytes:
    """The bytes of the manifest of ``run``, its own hash included."""
    doc: dict[str, Any] = {
        "vitreg_run": VERSION,
        "verb": run.verb,
        "model": run.model,
        "state": run.state,
        "started": run.started,
        "pid": pid,
        "host": host,
        "files": sorted(run.files),
        "records": {
            name: {"size": r.size, "sha256": r.sha256}
            for name, r in sorted(run.records.items())
            if name in run.files
        },
    }
    doc["manifest_sha256"] = _self_hash(doc)
    return (json.dumps(doc) + "\n").encode("utf-8")  # the C encoder: a save per log line


def _not_ours(path: Path, why: str) -> InputError:
    return InputError(
        f"{str(path)!r} {why}: this is not a manifest vitreg wrote, so vitreg removes and "
        "overwrites nothing on its word; pass another --out"
    )


def _entry(name: Any, path: Path) -> str:
    """A manifest entry: a plain relative name inside the folder, or an :class:`InputError`."""
    ok = isinstance(name, str) and 0 < len(name) <= MAX_NAME
    if ok:
        parts = PurePosixPath(name).parts
        ok = (
            bool(parts)
            and PurePosixPath(name).as_posix() == name  # no "./", "//" or trailing "/"
            and not name.startswith("/")
            and all(p != ".." and len(p.encode("utf-8", "replace")) <= 255 for p in parts)
            and "\\" not in name
            and all(ch.isprintable() for ch in name)
            and name not in OWN
        )
    if not ok:
        raise _not_ours(path, f"names {brief(name)}, not a file inside the folder")
    return name


def _record(name: str, value: Any, path: Path) -> Record:
    ok = (
        isinstance(value, dict)
        and set(value) == {"size", "sha256"}
        and isinstance(value["size"], int)
        and not isinstance(value["size"], bool)
        and value["size"] >= 0
        and isinstance(value["sha256"], str)
        and len(value["sha256"]) == 64
        and set(value["sha256"]) <= _HEX
    )
    if not ok:
        raise _not_ours(path, f"records {brief(name, 60)} as {brief(value)}, not a size and hash")
    return Record(value["size"], value["sha256"])


def read_manifest(out: Path) -> Manifest | None:
    """The checked manifest of ``out``; None when it has none. An :class:`InputError` when it
    is a link, too large, malformed, lists too many or unsafe names, or was edited."""
    path = out / MANIFEST
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_file():
        raise InputError(
            f"{str(path)!r} is a link or not a file: vitreg writes its manifest as a plain file, "
            "so this folder is not a run it owns; pass another --out"
        )
    doc = read_json(path, "run manifest", max_bytes=MAX_BYTES, max_depth=4)
    ok = (
        isinstance(doc, dict)
        and isinstance(doc.get("files"), list)
        and isinstance(doc.get("verb"), str)
        and isinstance(doc.get("state"), str)
        and isinstance(doc.get("model"), str | None)
        and isinstance(doc.get("records", {}), dict)
    )
    if not ok:
        raise _not_ours(path, "lacks the verb, model, state and files of a run")
    if len(doc["files"]) > MAX_FILES or len(doc.get("records", {})) > MAX_FILES:
        raise _not_ours(path, f"lists more than {MAX_FILES:,} files (a run writes a few hundred)")
    files = [_entry(name, path) for name in doc["files"]]
    records = {}
    if "manifest_sha256" in doc:  # a manifest without its own hash records nothing it proves
        listed = set(files)
        for name, value in doc.get("records", {}).items():
            if name not in listed:
                raise _not_ours(path, f"records {brief(name, 60)}, a file it does not list")
            records[name] = _record(name, value, path)
        if doc["manifest_sha256"] != _self_hash(doc):
            raise _not_ours(path, "was edited after vitreg wrote it (its own hash does not match)")
    started = doc.get("started")
    return Manifest(
        doc["verb"],
        doc["model"],
        doc["state"],
        started if isinstance(started, str) else "",
        files,
        records,
    )


def unproven(out: Path, run: Manifest, present: list[str]) -> list[str]:
    """The files of ``present`` (plain files of the folder ``run`` lists) whose content no
    longer matches their record, or that have none: vitreg cannot prove it wrote them."""
    return sorted(
        name
        for name in present
        if name not in run.records or not run.records[name].matches(out / name)
    )
