"""The JSON-lines training log: one record per step, appended atomically, trimmed on resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vitreg.core.disk import writing
from vitreg.core.io import write_text_atomic
from vitreg.core.run_dir import record as record_file
from vitreg.core.run_dir import seal_append


def append_record(path: Path, record: dict[str, float]) -> None:
    """Append one JSON line with a single ``write`` on an ``O_APPEND`` descriptor (no torn lines)."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    record_file(path)  # listed in the run's manifest before it is written
    with writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    seal_append(path, line)  # the manifest records the log as it now is


def read_records(path: Path) -> list[dict[str, float]]:
    """Every complete record of the log (a torn last line from a killed run is ignored)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def trim_after(path: Path, step: int) -> None:
    """Drop records past ``step`` (written by a run killed after its last checkpoint)."""
    records = read_records(path)
    kept = [r for r in records if r.get("step", 0) <= step]
    if path.is_file() and len(kept) != len(path.read_text(encoding="utf-8").splitlines()):
        write_text_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
