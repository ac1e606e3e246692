"""Shared CLI output: consoles, and turning vitreg's errors into one red paragraph and exit 2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.text import Text

from vitreg.errors import VitregError

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

# optional libraries and the pip extra that installs each
EXTRAS = {"transformers": "hf", "open_clip": "openclip", "skimage": "samples"}


def fail(message: str) -> typer.Exit:
    """Print ``message`` as one red paragraph on stderr; return the exit (code 2) to raise."""
    err_console.print(Text(f"error: {message}", style="red"))
    return typer.Exit(code=2)


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
