"""Shared CLI output: consoles, and turning vitreg's errors into one red paragraph and exit 2."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from vitreg.errors import RenderError, VitregError
from vitreg.verbs.result import Notice

RANK = int(os.environ.get("RANK", "0"))  # under torchrun only rank 0 prints (errors: every rank)
console = Console(highlight=False, quiet=RANK != 0)
err_console = Console(stderr=True, highlight=False, quiet=RANK != 0)
_errors = Console(stderr=True, highlight=False)

# optional libraries and the pip extra that installs each
EXTRAS = {"transformers": "hf", "open_clip": "openclip", "skimage": "samples"}


def show_line(markup: str) -> None:
    """A line that holds a path or a command, never wrapped (rich's soft wrap), so that it can
    be copied and pasted whole from a terminal of any width."""
    console.print(markup, soft_wrap=True)


def show_path(label: str, path: object, after: str = "") -> None:
    """``label: PATH`` (the path in bold) with ``after`` behind it, on one unwrapped line."""
    show_line(f"{label}: [bold]{escape(str(path))}[/bold]{after}")


def fail(message: str) -> typer.Exit:
    """Print ``message`` as one red paragraph on stderr; return the exit (code 2) to raise."""
    where = f"rank {RANK}: " if RANK else ""
    _errors.print(Text(f"{where}error: {message}", style="red"))
    return typer.Exit(code=2)


def bug(e: BaseException) -> typer.Exit:
    """Print an unexpected exception as a bug report hint on stderr; return the exit (code 1)."""
    first = (str(e).strip().splitlines() or [""])[0][:300]  # however large the exception
    what = f"{type(e).__name__}: {first}" if first else type(e).__name__
    _errors.print(
        Text(
            f"error: this is a bug in vitreg, please report it ({what}); rerun with "
            "`vitreg --debug <command> ...` for the traceback",
            style="red",
        )
    )
    return typer.Exit(code=1)


def render_failed(e: RenderError) -> typer.Exit:
    """Print a rendering failure (a bug, after the results were saved) on stderr: where the
    results are and the command that renders the report again; return the exit (code 1)."""
    _errors.print(
        Text(
            f"error: this is a bug in vitreg, please report it: rendering the report failed "
            f"({e.cause}). The results are saved in {e.saved}; `{e.again}` renders the report "
            "again from them. Rerun with `vitreg --debug <command> ...` for the traceback.",
            style="red",
        )
    )
    return typer.Exit(code=1)


def show_notice(n: Notice) -> None:
    """Print one notice of a verb as it happens: the random-weights one as a banner, loader
    notes and warnings with their prefix, cautions in yellow, images in cyan, log lines of a
    long run on stderr."""
    text = escape(n.text)
    if n.kind == "random_init":
        head, _, rest = text.partition(": ")
        console.print(f"[bold yellow]{head}:[/bold yellow][yellow] {rest}[/yellow]")
    elif n.kind in ("model", "warning"):
        prefix = "note" if n.kind == "model" else "warning"
        console.print(f"[yellow]{prefix}: {text}[/yellow]")
    elif n.kind == "log":
        err_console.print(text)
    elif n.caution:
        console.print(f"[yellow]{text}[/yellow]")
    elif n.kind == "images":  # may name a folder: one unwrapped line
        console.print(f"[cyan]{text}[/cyan]", soft_wrap=True)
    else:
        console.print(text)


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
