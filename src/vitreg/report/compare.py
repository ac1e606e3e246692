"""``vitreg compare``: the headline metrics of several run directories in one table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitreg.errors import InputError
from vitreg.report.io import write_json_atomic, write_text_atomic
from vitreg.report.markdown import Table, markdown_table, num


def load_metrics(run: Path) -> dict[str, Any]:
    """The metrics.json of a run directory (or the file itself)."""
    path = run / "metrics.json" if run.is_dir() else run
    if not path.is_file():
        raise InputError(f"{run} has no metrics.json; pass run directories written by vitreg")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON ({e}); was the run interrupted?") from None


def labels(runs: list[Path]) -> list[str]:
    """Column labels: the run folder names, made unique with their parents when they clash."""
    names = [r.name if r.is_dir() else r.parent.name for r in runs]
    if len(set(names)) == len(names):
        return names
    return [str(r) for r in runs]


def compare_runs(runs: list[Path], contains: str | None = None) -> dict[str, Any]:
    """One row per headline metric (in first-seen order), one value per run (None if absent)."""
    if not runs:
        raise InputError("compare needs at least one run directory")
    docs = [load_metrics(Path(r)) for r in runs]
    order: dict[str, bool | None] = {}
    values: list[dict[str, Any]] = []
    for doc in docs:
        found = {}
        for m in doc.get("metrics", []):
            if contains is None or contains in m["name"]:
                order.setdefault(m["name"], m.get("higher_is_better"))
                found[m["name"]] = m.get("value")
        values.append(found)
    rows = [
        {"metric": name, "higher_is_better": better, "values": [v.get(name) for v in values]}
        for name, better in order.items()
    ]
    meta = [
        {"run": str(r), "command": d.get("command"), "model": d.get("model", {}).get("spec")}
        for r, d in zip(runs, docs, strict=True)
    ]
    return {"runs": labels([Path(r) for r in runs]), "sources": meta, "rows": rows}


def write_compare(out: Path, merged: dict[str, Any]) -> Path:
    """compare.md (the table and each run's command) and compare.json in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    table = Table(
        ["metric", *merged["runs"]],
        [
            [
                f"`{r['metric']}`" + {True: " ↑", False: " ↓"}.get(r["higher_is_better"], ""),
                *(num(v) for v in r["values"]),
            ]
            for r in merged["rows"]
        ],
    )
    lines = ["# vitreg compare", "", markdown_table(table), "", "## Runs", ""]
    lines += [f"- `{s['run']}`: `{s['command']}`" for s in merged["sources"]]
    write_text_atomic(out / "compare.md", "\n".join(lines) + "\n")
    write_json_atomic(out / "compare.json", merged)
    return out
