"""Register the ``vitreg_*`` timm names as soon as timm is imported, without importing it here.

``import vitreg`` stays fast: if timm is already loaded the names are registered at once,
otherwise a meta-path finder waits for ``import timm`` and registers them after it finishes.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any


def _register() -> None:
    try:
        importlib.import_module("vitreg.arch.registry")
    except Exception as err:  # never break `import timm` because of vitreg
        warnings.warn(f"vitreg could not register its timm models: {err}", stacklevel=2)


class _TimmWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps timm's loader so registration runs after timm executes."""

    busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "timm" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec("timm")
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _register()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Register now if timm is loaded, else when it gets imported (idempotent)."""
    if "timm" in sys.modules:
        _register()
    elif not any(isinstance(f, _TimmWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _TimmWatcher())
