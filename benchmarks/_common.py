"""The runner every benchmark script shares: its options, the interleaved timing of arms, speed
ratios, fresh child processes (and the JSON line a child prints), memory readings, the result
file and the closing summary."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def synthetic(n: int, batch_size: int, size: int, seed: int = 0) -> Iterator[Any]:
    """``n`` random images in batches, generated lazily."""
    import torch

    g = torch.Generator().manual_seed(seed)
    for start in range(0, n, batch_size):
        yield torch.randn(min(batch_size, n - start), 3, size, size, generator=g)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports ru_maxrss in KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


def rss_mb() -> float | None:
    """Current resident set size in MB (Linux /proc; None elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def commit() -> str:
    """The checked-out commit, ``+changes`` when tracked files differ from it ("unknown"
    outside a git checkout)."""

    def git(*args: str) -> str:
        cwd = Path(__file__).parent
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def environment() -> dict[str, Any]:
    """Versions, machine facts, the date (UTC) and the commit recorded with every result."""
    import timm
    import torch

    import vitreg

    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "commit": commit(),
        "vitreg": vitreg.__version__,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": os.getloadavg()[0],  # other work on the machine skews timings
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    }


def run_child(script: str, args: list[str]) -> dict[str, Any]:
    """Run ``script args`` in a fresh Python process; its last stdout line is a JSON result."""
    proc = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(script).name} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def emit(result: dict[str, Any]) -> None:
    """A child's answer to :func:`run_child`: its result as the last line of stdout."""
    print(json.dumps(result))


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of the script's docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])


def parse_quick(p: argparse.ArgumentParser, argv: list[str] | None, **quick: Any) -> Any:
    """Parse ``argv`` with a ``--quick`` flag that sets the options ``quick`` (dest -> value) to
    the small sizes of ``run_all.py --quick``; an option given on the command line wins."""
    sizes = ", ".join(f"--{k.replace('_', '-')}={v}" for k, v in quick.items())
    p.add_argument("--quick", action="store_true", help=f"small sizes: {sizes}")
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**quick)
        args = p.parse_args(argv)
    return args


def add_size_and_out_options(p: Any, benchmark: str) -> None:
    """The options every benchmark takes: input size, a shallower model for smoke runs, --out."""
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--depth", type=int, default=None, help="fewer blocks (smoke runs)")
    p.add_argument("--out", default=str(RESULTS / f"{benchmark}.json"))


def add_timing_options(p: Any, batch_size: int, repeats: int = 7, warmup: int = 2) -> None:
    """Batch size and the interleaved timed / untimed runs per arm of a speed comparison."""
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--repeats", type=int, default=repeats, help="timed runs per arm, interleaved")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed runs per arm first")


def child_flags(args: Any, keys: tuple[str, ...]) -> list[str]:
    """Command-line flags repeating the options ``keys`` of ``args`` for a child process."""
    return [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in keys and v is not None
    ]


def write_result(args: Any, benchmark: str, **fields: Any) -> Path:
    """Write ``args.out``: the benchmark name, its settings (every option but --out/--child),
    the environment (measured here unless a child's is given) and ``fields``."""
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "out")}
    fields.setdefault("environment", environment())
    return write_json(args.out, {"benchmark": benchmark, "settings": settings, **fields})


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2))
    return out


def build(name: str, img_size: int, depth: int | None):
    """A random-weight timm model wrapped by vitreg (``depth`` shrinks it for smoke runs)."""
    import vitreg

    kwargs: dict[str, Any] = {"img_size": img_size}
    if depth is not None:
        kwargs["depth"] = depth
    return vitreg.load(f"timm:{name}", pretrained=False, **kwargs)


def interleaved(
    arms: dict[str, Callable[[], Any]],
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Time the arms ``repeats`` times each, their order reversed every other round (ABBA for
    two) so all see the same machine load; returns every timing and each arm's median, in
    seconds of ``clock`` (wall time, or ``time.process_time`` for this process's CPU time)."""
    names = list(arms)
    times: dict[str, list[float]] = {arm: [] for arm in names}
    for r in range(repeats):
        for arm in names if r % 2 == 0 else names[::-1]:
            t0 = clock()
            arms[arm]()
            times[arm].append(clock() - t0)
    return times, {arm: statistics.median(ts) for arm, ts in times.items()}


def speed(
    times: dict[str, list[float]], batch_size: int, ratio: str, over: str, under: str
) -> dict[str, Any]:
    """The JSON fields of a two-arm speed comparison: every timing, the medians, images/s, and
    ``ratio`` = median seconds of ``over`` / those of ``under``, overall and per round."""
    med = {arm: statistics.median(ts) for arm, ts in times.items()}
    return {
        "seconds": times,
        "median_s": med,
        "images_per_s": {arm: batch_size / s for arm, s in med.items()},
        ratio: med[over] / med[under],
        "ratio_per_round": [o / u for o, u in zip(times[over], times[under], strict=True)],
    }


def verdict(ok: bool, miss: str = "BELOW TARGET") -> str:
    """What the summary says of a target: "ok" or ``miss``."""
    return "ok" if ok else miss


def finish(args: Any, benchmark: str, res: dict[str, Any], lines: list[str], **fields: Any) -> Path:
    """Write the result (``res`` and ``fields``, e.g. the target, with the settings and the
    environment), print the summary ``lines`` and where the file is."""
    out = write_result(args, benchmark, **fields, **res)
    for line in lines:
        print(line)
    print(f"wrote {out}")
    return out
