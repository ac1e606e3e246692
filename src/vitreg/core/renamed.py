"""Names that changed keep working for one release: a module's ``__getattr__`` made by
:func:`renamed` returns the new object under the old name with a ``DeprecationWarning`` that
says the new one."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


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
