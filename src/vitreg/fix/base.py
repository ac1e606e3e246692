"""A fix edits a model's forward until its handle is removed: ``apply`` or ``with applied``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vitreg.hooks.sites import Handle
from vitreg.models.model import Model


class Fix(ABC):
    """``apply(model)`` returns a removable handle; ``applied(model)`` scopes it to a block."""

    @abstractmethod
    def apply(self, model: Model) -> Handle: ...

    @contextmanager
    def applied(self, model: Model) -> Iterator[Model]:
        handle = self.apply(model)
        try:
            yield model
        finally:
            handle.remove()


def fix_description(fix: object) -> dict[str, Any]:
    """A fix as runs record it: its class name first, then what its ``describe()`` says."""
    describe = getattr(fix, "describe", None)
    return {"name": type(fix).__name__, **(describe() if describe is not None else {})}
