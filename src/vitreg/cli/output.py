"""Shared CLI output: consoles, and turning vitreg's errors into one red paragraph and exit 2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from vitreg.errors import VitregError

RANK = int(os.environ.get("RANK", "0"))  # under torchrun only rank 0 prints (errors: every rank)
console = Console(highlight=False, quiet=RANK != 0)
err_console = Console(stderr=True, highlight=False, quiet=RANK != 0)
_errors = Console(stderr=True, highlight=False)

# optional libraries and the pip extra that installs each
EXTRAS = {"transformers": "hf", "open_clip": "openclip", "skimage": "samples"}


def fail(message: str) -> typer.Exit:
    """Print ``message`` as one red paragraph on stderr; return the exit (code 2) to raise."""
    where = f"rank {RANK}: " if RANK else ""
    _errors.print(Text(f"{where}error: {message}", style="red"))
    return typer.Exit(code=2)


def bug(e: BaseException) -> typer.Exit:
    """Print an unexpected exception as a bug report hint on stderr; return the exit (code 1)."""
    first = (str(e).strip().splitlines() or [""])[0]
    what = f"{type(e).__name__}: {first}" if first else type(e).__name__
    _errors.print(
        Text(
            f"error: this is a bug in vitreg, please report it ({what}); rerun with "
            "`vitreg --debug <command> ...` for the traceback",
            style="red",
        )
    )
    return typer.Exit(code=1)


def random_init_banner(spec: str) -> None:
    """Say on the console, before any result, that ``spec`` has random weights."""
    console.print(
        f"[bold yellow]RANDOM WEIGHTS:[/bold yellow][yellow] {escape(spec)} is built with "
        "--random-init (random, untrained weights); its artifacts, or their absence, say nothing "
        "about the trained model.[/yellow]"
    )


def missing_dependency(e: ImportError) -> str:
    """The fix for an optional library that is not installed."""
    module = (e.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    fix = f"pip install 'vitreg[{extra}]'" if extra else f"pip install {module or 'it'}"
    return f"this needs the optional library {module or e}, which is not installed: {fix}"


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn :class:`VitregError` and missing optional libraries into a message and exit 2."""
    try:
        yield
    except VitregError as e:
        raise fail(str(e)) from None
    except ImportError as e:
        raise fail(missing_dependency(e)) from None


def join_torchrun(device: str | None) -> str | None:
    """Under torchrun (``WORLD_SIZE > 1``) join the process group (gloo on CPU, NCCL on GPUs);
    the device this rank runs on: ``cuda:LOCAL_RANK`` when none is given on GPUs, else
    ``device`` unchanged. Every rank then runs the verb on the same images; the library shards
    the forward passes and merges the statistics, and only rank 0 prints and writes files."""
    from vitreg import distributed

    if not distributed.under_torchrun():
        return device
    ctx = distributed.setup(device)
    return str(ctx.device) if device is None and ctx.device.type == "cuda" else device


def is_main() -> bool:
    """Whether this process writes the run directory (rank 0, or the only process)."""
    from vitreg import distributed

    return distributed.is_main()
