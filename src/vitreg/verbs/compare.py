"""The compare verb: the headline metrics of several runs in one table, and with ``--out`` a
comparison folder (comparison.md, report.html, comparison.json)."""

from __future__ import annotations

import shlex

from vitreg.configs import CompareConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.verbs.result import CompareRun, Listener


def compare_line(cfg: CompareConfig) -> str:
    """The command line of a ``vitreg compare`` that wrote ``cfg.out``."""
    parts = ["vitreg", "compare", *map(str, cfg.runs), "--out", str(cfg.out)]
    return shlex.join(parts + (["--filter", cfg.contains] if cfg.contains is not None else []))


@session()  # the --out claimed inside is released when the verb ends
def run_compare(
    cfg: CompareConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> CompareRun:
    """Merge the headline metrics of ``cfg.runs`` (folders that are not runs are skipped with a
    note) and, with ``cfg.out``, write the comparison there."""
    from vitreg.core.out_dir import check_out
    from vitreg.report.compare import compare_runs, long_rows, write_compare

    if cfg.out is not None:
        check_out(cfg.out, "compare", None, cfg.overwrite)
    merged = compare_runs(cfg.runs, cfg.contains)
    if cfg.out is not None:
        write_compare(cfg.out, merged, cfg.figure_format, compare_line(cfg))
    return CompareRun(merged, long_rows(merged), cfg.out)


VERB = register(
    Verb(
        config=CompareConfig,
        run=run_compare,
        help="Merge the headline metrics of several runs: run, metric, value, direction "
        "(folders that are not runs are skipped with a note).",
        argument=("runs",),
        flags={"contains": "--filter"},
    )
)
