"""Exceptions vitreg raises; each message says what went wrong and what to do about it."""

from __future__ import annotations


class VitregError(Exception):
    """Base class of every error vitreg raises on purpose."""


class SpecError(VitregError, ValueError):
    """A model spec string could not be parsed or names nothing vitreg knows."""


class UnsupportedModelError(VitregError, TypeError):
    """The model object belongs to a family no adapter handles."""


class WeightsError(VitregError, OSError):
    """Weights could not be fetched, found, or read."""


class InputError(VitregError, ValueError):
    """Images or tensors passed to a model do not fit it."""


class WriteError(VitregError):
    """A file could not be written (disk full, read-only, not permitted); ``errno`` says why."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class HookError(VitregError, KeyError):
    """A hook name is unknown or a hook cannot do what was asked of it."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class RenderError(Exception):
    """Rendering a report (figures, Markdown, HTML) failed after the results were saved: a bug
    in vitreg, not in the input. ``saved`` is the results file on disk, ``again`` the command
    that renders the report from it again."""

    def __init__(self, saved: str, again: str, cause: BaseException) -> None:
        first = (str(cause).strip().splitlines() or [""])[0]
        self.cause = f"{type(cause).__name__}: {first}" if first else type(cause).__name__
        self.saved, self.again = saved, again
        super().__init__(
            f"rendering the report failed ({self.cause}) after the results were saved in "
            f"{saved}; `{again}` renders the report again from them"
        )


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages: a hostile input never
    makes a message longer than a line, however large or deep it is."""
    if isinstance(value, dict | list | tuple | set) and len(value) > 8:
        return f"a {type(value).__name__} of {len(value)} items"
    try:
        shown = repr(value)
    except Exception:  # a repr that fails (or recurses too deep) must not hide the real error
        return f"a {type(value).__name__}"
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
