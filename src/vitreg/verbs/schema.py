"""The schema verb: the JSON Schema of metrics.json (every verb's results, every field typed),
for readers of runs in other languages."""

from __future__ import annotations

import json
import os
from pathlib import Path

from vitreg.configs import SchemaConfig
from vitreg.core.verb import Verb, register
from vitreg.errors import InputError
from vitreg.progress import SILENT, Progress
from vitreg.verbs.result import Listener, SchemaRun


def run_schema(
    cfg: SchemaConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> SchemaRun:
    """The schema's text, also written (atomically) to ``cfg.out`` when given: a new file, or
    an existing one with ``cfg.overwrite``; a folder is refused."""
    from vitreg.core.io import write_text_atomic
    from vitreg.results.schema import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if cfg.out is not None:
        check_target(cfg.out, cfg.overwrite)
        write_text_atomic(cfg.out, text)
    return SchemaRun(text, cfg.out)


def check_target(out: Path, overwrite: bool) -> None:
    """``out`` may receive the schema: not a folder, and new unless ``overwrite``."""
    if out.is_dir():
        raise InputError(
            f"--out {str(out)!r} is a folder; the schema is one file: pass a file name, e.g. "
            f"{str(out / 'metrics.schema.json')!r}"
        )
    if os.path.lexists(out) and not overwrite:
        raise InputError(
            f"--out {str(out)!r} already exists; pass --overwrite to replace it, or another file"
        )


VERB = register(
    Verb(
        config=SchemaConfig,
        run=run_schema,
        help="Export the JSON Schema of metrics.json (every verb's results, every field typed).",
    )
)
