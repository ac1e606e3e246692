"""One registry type for every named, pluggable thing (model loaders, adapters, probe tasks,
datasets, ``local:`` config sections), in the style of lm-evaluation-harness: entries by name,
listed by glob pattern, registered by decorator or lazily as ``"module:attr"`` (imported on first
use), in an explicit priority order where order matters (adapters: the first that matches wins).

A registry fills itself on first read: its own ``modules`` (the built-ins, which register on
import) and then those that higher packages asked :mod:`vitreg.core.plugins` to import for it.
"""

from __future__ import annotations

import fnmatch
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from vitreg.core import plugins

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind (see the module docstring)."""

    def __init__(self, kind: str, modules: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._modules = list(modules)
        self._entries: dict[str, T | str] = {}
        self._priority: dict[str, int] = {}

    @overload
    def register(self, name: str, entry: None = None, *, priority: int = 0) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T | str, *, priority: int = 0) -> T | str: ...

    def register(
        self, name: str, entry: T | str | None = None, *, priority: int = 0
    ) -> T | str | Callable[[T], T]:
        """Add ``entry`` (an object, or ``"module:attr"`` imported on first use: a string entry
        is always such a reference) as ``name``,
        replacing an entry of that name; without ``entry``, a decorator that adds what it
        decorates. Higher ``priority`` comes first in :meth:`names` and :meth:`values`."""
        if entry is None:

            def deco(obj: T) -> T:
                self.register(name, obj, priority=priority)
                return obj

            return deco
        if isinstance(entry, str) and ":" not in entry:
            raise ValueError(f"a lazy {self.kind} entry is 'module:attr', got {entry!r}")
        self._entries[name] = entry
        self._priority[name] = priority
        return entry

    def _fill(self) -> None:
        while self._modules:
            importlib.import_module(self._modules.pop(0))
        plugins.fill(self.kind)

    def get(self, name: str) -> T:
        """The entry called ``name`` (a lazy one is imported now); ``KeyError`` names the known
        ones."""
        self._fill()
        if name not in self._entries:
            raise KeyError(f"no {self.kind} {name!r}; known: {', '.join(self.names())}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
            self._entries[name] = entry
        return entry  # type: ignore[return-value]

    __getitem__ = get

    def names(self, pattern: str = "*") -> list[str]:
        """The names matching the glob ``pattern``, highest priority first (then in the order
        they were registered)."""
        self._fill()
        order = sorted(self._entries, key=lambda n: -self._priority[n])  # stable: ties keep order
        return [n for n in order if fnmatch.fnmatchcase(n, pattern)]

    def values(self, pattern: str = "*") -> list[T]:
        """The entries of :meth:`names`, imported."""
        return [self.get(n) for n in self.names(pattern)]

    def items(self, pattern: str = "*") -> list[tuple[str, T]]:
        """``(name, entry)`` pairs of :meth:`names`, imported."""
        return [(n, self.get(n)) for n in self.names(pattern)]

    def __contains__(self, name: object) -> bool:
        self._fill()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._fill()
        return len(self._entries)
