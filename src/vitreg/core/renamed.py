"""Names that changed keep working for one release: a module's ``__getattr__`` made by
:func:`renamed` returns the new object under the old name, and :func:`moved` lets a moved
module import under its old name, each with a ``DeprecationWarning`` that says the new one."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def renamed(module: str, names: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: each old name in ``names`` gives the object now
    called ``names[old]`` in ``namespace`` (the module's globals), with a warning."""

    def __getattr__(name: str) -> Any:
        if name in names:
            warnings.warn(
                f"{module}.{name} is now {module}.{names[name]}; the old name goes in the next "
                "release",
                DeprecationWarning,
                stacklevel=2,
            )
            return namespace[names[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook: a module imported under an old name (or below an old package name) is
    the module of its new name, with a ``DeprecationWarning`` saying the new one."""

    def __init__(self, moves: dict[str, str]) -> None:
        self.moves = moves

    def new_name(self, fullname: str) -> str | None:
        """The new name of ``fullname``, or None if it did not move."""
        for old, new in self.moves.items():
            if fullname == old or fullname.startswith(old + "."):
                return new + fullname[len(old) :]
        return None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if self.new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        new = self.new_name(spec.name)
        warnings.warn(
            f"{spec.name} is now {new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: Any) -> None:
        """The new module ran when it was imported."""


def moved(moves: dict[str, str]) -> None:
    """Let each old module name of ``moves`` import as its new one (once per process)."""
    if not any(isinstance(f, MovedModules) and f.moves == moves for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModules(moves))  # before the path finder: old paths exist


def loose_settings(name: str, part: type, fields: tuple[str, ...]) -> Callable[[F], F]:
    """A decorator for a function that takes the settings part ``part`` whole as ``name``: the
    keywords ``fields`` of its older signature, given loose, still work for one release (with a
    ``DeprecationWarning``): they are set on the part given (or on the default one)."""

    def deco(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            loose = {k: kwargs.pop(k) for k in fields if k in kwargs}
            if not loose:
                return fn(*args, **kwargs)
            warnings.warn(
                f"{fn.__qualname__}({', '.join(f'{k}=' for k in loose)}...) is now "
                f"{fn.__qualname__}(..., {name}={part.__name__}({', '.join(loose)}=...)); the "
                "loose keywords go in the next release",
                DeprecationWarning,
                stacklevel=2,
            )
            bound = signature.bind_partial(*args, **kwargs)
            given = bound.arguments.get(name)
            base = given.model_dump() if given is not None else {}
            bound.arguments[name] = part.model_validate({**base, **loose})
            return fn(*bound.args, **bound.kwargs)

        return wrapper  # type: ignore[return-value]

    return deco
