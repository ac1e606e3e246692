"""How library code reports progress without printing: the caller passes a :class:`Progress`
(the CLI's draws rich bars in a terminal and writes plain lines otherwise; :data:`SILENT`, the
default, does nothing).

A phase is ``with progress(total, label) as update: ... update(done, **status)``: ``total`` is the
number of steps (``None`` when unknown), ``done`` the steps finished so far and ``status`` short
values shown beside the bar (``loss=0.31``). A phase that stops before ``total`` (an early stop)
ends at its real last step. ``progress.note(text)`` reports a one-line event (a cache hit).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

Update = Callable[..., None]  # update(done: int, **status: object)


class Progress(Protocol):
    """A factory of progress phases plus one-line notes (see the module docstring)."""

    def __call__(self, total: int | None, label: str) -> AbstractContextManager[Update]: ...

    def note(self, message: str) -> None: ...


def _ignore(done: int, **status: object) -> None:
    return None


class Silent:
    """Progress that reports nothing: the default of every library call."""

    def __call__(self, total: int | None, label: str) -> AbstractContextManager[Update]:
        return nullcontext(_ignore)

    def note(self, message: str) -> None:
        return None


SILENT = Silent()
