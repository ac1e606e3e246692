"""A fix edits a model's forward until its handle is removed: ``apply`` or ``with applied``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import TypeAdapter

from vitreg.hooks.sites import Handle
from vitreg.models.model import Model
from vitreg.results.fix import FixDescription, NamedFix
from vitreg.results.schema import plain


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


def fix_description(fix: object) -> FixDescription:
    """A fix as runs record it: its class name first, then what its ``describe()`` says."""
    return named(fix, type(fix).__name__)


def named(fix: object, name: str) -> FixDescription:
    """``fix``'s description under ``name``: vitreg's fixes describe themselves typed; a user's
    fix's ``describe()`` mapping (or none) is read as a description."""
    describe = getattr(fix, "describe", None)
    said = describe() if describe is not None else {}
    if isinstance(said, NamedFix):
        return said.model_copy(update={"name": name})
    return TypeAdapter(FixDescription).validate_python(plain({"name": name, **said}))
