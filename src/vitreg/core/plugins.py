"""Modules that fill a lower layer's registry, named by the package above that owns them and
imported the first time the registry is read (the ``planted:`` loader, a saved fix's ``local:``
section): ``import vitreg`` then imports neither torch nor those packages, and ``vitreg --help``
stays fast."""

from __future__ import annotations

import importlib

_PENDING: dict[str, list[str]] = {}


def provide(registry: str, module: str) -> None:
    """Have ``module`` imported (it registers itself) before ``registry`` is first read."""
    pending = _PENDING.setdefault(registry, [])
    if module not in pending:
        pending.append(module)


def fill(registry: str) -> None:
    """Import every module still pending for ``registry`` (each once; idempotent)."""
    while _PENDING.get(registry):
        importlib.import_module(_PENDING[registry].pop(0))
