"""``index.json`` of an export folder: written when the run starts (its settings and outlier
rules), again after each finished shard, and whole at the end; a rerun with other settings is
refused, one with the same settings resumes."""

from __future__ import annotations

from pathlib import Path

from vitreg.core.io import write_text_atomic
from vitreg.core.readers import read_json
from vitreg.errors import InputError
from vitreg.results.export import ExportIndex, ExportSettings

INDEX = "index.json"
MAX_INDEX = 512 * 2**20  # an index lists every image name: 10M names fit


def read_index(folder: Path) -> ExportIndex | None:
    """The index of ``folder`` (``None``: there is none)."""
    path = Path(folder) / INDEX
    if not path.is_file():
        return None
    doc = read_json(path, "export index", max_bytes=MAX_INDEX)
    try:
        return ExportIndex.model_validate(doc)
    except ValueError as e:
        raise InputError(f"{str(path)!r} is not a vitreg export index: {e}") from None


def check_resume(found: ExportIndex | None, settings: ExportSettings) -> None:
    """An earlier export in the folder must have exactly these settings."""
    if found is None or found.settings == settings:
        return
    old, new = found.settings.model_dump(), settings.model_dump()
    diff = ", ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in new if old.get(k) != new[k])
    raise InputError(
        f"--out holds an export with other settings ({diff}); resume it with the same "
        "settings, pass another --out, or --overwrite to start again"
    )


def write_index(folder: Path, index: ExportIndex) -> None:
    write_text_atomic(Path(folder) / INDEX, index.model_dump_json(indent=1) + "\n")
