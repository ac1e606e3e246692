"""``vitreg inspect SPEC``: a model's family, dims, token layout and hook names on the console
(the loading is :func:`vitreg.verbs.inspect.run_inspect`)."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli.output import console


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``'{0..2,5,7,8}'``; a single value stays bare."""
    values = sorted(values)
    if len(values) == 1:
        return str(values[0])
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    parts = [f"{r[0]}..{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs]
    return "{" + ",".join(parts) + "}"


def compress_names(names: list[str]) -> list[str]:
    """Fold numbered hook names: ``blocks.0.x .. blocks.11.x`` -> ``blocks.{0..11}.x``.

    Numeric path components are folded from the innermost out, so stage/block names of
    hierarchical models fold too (``layers.{0,1,3}.blocks.{0,1}.x``). First-seen order is kept.
    """
    entries = [n.split(".") for n in names]
    numeric = [[i for i, p in enumerate(parts) if p.isdigit()] for parts in entries]
    for depth in range(1, max((len(pos) for pos in numeric), default=0) + 1):
        groups: dict[tuple, tuple[list[str], list[int], list[int]]] = {}
        for parts, pos in zip(entries, numeric, strict=True):
            at = pos[-depth] if len(pos) >= depth else -1
            key = (tuple(p if i != at else "*" for i, p in enumerate(parts)), at)
            values = groups.setdefault(key, (parts, pos, []))[2]
            if at >= 0:
                values.append(int(parts[at]))
        entries, numeric = [], []
        for (_, at), (parts, pos, values) in groups.items():
            entries.append([_ranges(values) if i == at else p for i, p in enumerate(parts)])
            numeric.append(pos)
    return [".".join(parts) for parts in entries]


def _show(info: dict[str, Any], layout: Any) -> None:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    h, w = info["image_size"]
    rows = {
        "spec": info["spec"],
        "adapter": f"{info['family']} ({info['source']})",
        "class": info["class"],
        "dims": f"{info['n_layers']} layers, d_model {info['d_model']}, "
        f"d_mlp {info['d_mlp']}, {info['n_heads']} heads",
        "parameters": f"{info['n_params'] / 1e6:.1f}M",
        "image size": f"{h}x{w}",
        "layout": layout.describe(),
        "attention": info["attention"],
        "extra tokens": "can be inserted" if info["supports_insertion"] else "not supported",
    }
    for key, value in rows.items():
        table.add_row(key, escape(str(value)))
    for i, note in enumerate(info["notes"]):
        table.add_row("notes" if i == 0 else "", f"[yellow]- {escape(note)}[/yellow]")
    console.print(table)
    if "hooks" in info:
        console.print(f"\n[bold]hook names[/bold] ({len(info['hooks'])}, in forward order)")
        for name in compress_names(info["hooks"]):
            console.print(f"  {name}")


def show_run(run: Any, cfg: Any) -> None:
    """The description as a table, or as JSON with ``--json``."""
    if cfg.as_json:
        typer.echo(json.dumps(run.info, indent=2))
    else:
        _show(run.info, run.layout)
