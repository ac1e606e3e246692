"""The model families vitreg supports, as ``vitreg models`` lists them: each adapter declares the
families it wraps (:attr:`~vitreg.models.adapters.base.Adapter.families`), so a new adapter is
listed by registering it."""

from __future__ import annotations

import dataclasses
import importlib.util

from vitreg.models.adapters.base import ADAPTERS, Family


def families() -> list[Family]:
    """Every family of every registered adapter (in the adapters' priority order), each with
    its adapter's ``family`` name."""
    return [
        dataclasses.replace(fam, adapter=cls.family)
        for cls in ADAPTERS.values()
        for fam in vars(cls).get("families", ())
    ]


def get_family(key: str) -> Family:
    """The family named ``key``; ``KeyError`` lists the known keys."""
    known = families()
    for fam in known:
        if fam.key == key:
            return fam
    raise KeyError(f"no family {key!r}; known: {[f.key for f in known]}")


def status(fam: Family) -> str:
    """'ready', or what is missing here: the optional library or the loader."""
    from vitreg.models.load import LOADERS

    if importlib.util.find_spec(fam.library) is None:
        return f"pip install 'vitreg[{fam.extra}]'" if fam.extra else f"needs {fam.library}"
    source = fam.examples[0].split(":", 1)[0]
    if source not in LOADERS:
        return f"no {source!r} loader yet"
    return "ready"
