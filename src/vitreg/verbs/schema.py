"""The schema verb: the JSON Schema of metrics.json (every verb's results, every field typed),
for readers of runs in other languages."""

from __future__ import annotations

import json

from vitreg.configs import SchemaConfig
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.verbs.result import Listener, SchemaRun


def run_schema(
    cfg: SchemaConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> SchemaRun:
    """The schema's text, also written (atomically) to ``cfg.out`` when given."""
    from vitreg.core.io import write_text_atomic
    from vitreg.results.schema import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if cfg.out is not None:
        write_text_atomic(cfg.out, text)
    return SchemaRun(text, cfg.out)


VERB = register(
    Verb(
        config=SchemaConfig,
        run=run_schema,
        help="Export the JSON Schema of metrics.json (every verb's results, every field typed).",
    )
)
