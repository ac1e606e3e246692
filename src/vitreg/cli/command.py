"""The click classes behind vitreg's commands: help text without a type on flags, and every
unexpected exception reported as a bug in one paragraph (the traceback only with ``--debug``)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.exceptions import TyperException

from vitreg.cli.output import bug, fail, render_failed
from vitreg.errors import RenderError, VitregError


def _plain_flags(params: list[Any]) -> list[Any]:
    """``params`` with on/off flags shown bare in help (typer would print ``<bool>`` beside them)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def unwrapped(text: str | None) -> str | None:
    """Help text with its source line breaks removed inside each paragraph, so that rich wraps
    it at word boundaries to the terminal's width (typer keeps them in the list of commands)."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(re.sub(r"\s*\n\s*", " ", p).strip() for p in paragraphs)


class VitregCommand(TyperCommand):
    """A verb: flags without a type in its help, its docstring wrapped at word boundaries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = unwrapped(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


class VitregGroup(TyperGroup):
    """The ``vitreg`` app (and its sub-apps): vitreg's own errors exit 2 with their message; any
    other exception is a bug, reported in one paragraph with exit 1 (a rendering failure also
    says where the results are saved and how to render them again), unless ``--debug`` asks
    for the traceback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = unwrapped(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (TyperException, typer.Exit, typer.Abort):
            raise  # usage errors, exits and aborts keep their own handling
        except VitregError as e:
            raise fail(str(e)) from None
        except RenderError as e:
            if debug_requested(ctx):
                raise
            raise render_failed(e) from None
        except Exception as e:
            if debug_requested(ctx):
                raise
            raise bug(e) from None


def debug_requested(ctx: Any) -> bool:
    """Whether ``--debug`` was given to the root command of ``ctx``."""
    return bool(ctx.find_root().params.get("debug"))
