"""Layers that only point down: every import between vitreg's packages goes to a lower layer.

The order is written once, in :data:`LAYERS`. Imports inside functions (lazy imports) and under
``TYPE_CHECKING`` count too: the point is the direction of the dependency, not when it runs.
A lower layer that needs something from a higher one offers a registry the higher one fills on
import (``models.load.LOADERS`` for ``planted:``, ``models.loaders.local.SECTIONS``
for a saved fix); the top-level ``vitreg/__init__.py`` imports the packages that register.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

import vitreg

SRC = Path(vitreg.__file__).parent

#: vitreg's packages and top-level modules, lowest first; each may import only those before it
LAYERS = (
    "errors",  # exceptions
    "progress",  # the progress protocol library code reports through
    "device",  # the --device check
    "core",  # TokenLayout, atomic writers, the version
    "hooks",  # hook sites, names, reducers, activation cache, pattern readers
    "distributed",  # rank/world, sharding, merging reducers across ranks
    "models",  # loading (spec registry), adapters, Model
    "testing",  # planted fixtures (registers the planted: loader), synthetic images
    "data",  # image folders, datasets, transforms
    "arch",  # trainable variants registered with timm
    "analysis",  # norms, outlier rules, attention, LN separation, redundancy
    "fix",  # NeuronSet and the fixes that edit its units (registers local: saved fixes)
    "neurons",  # discovery, causal selection, calibration of fixes, the automatic path
    "train",  # training loops
    "probe",  # feature cache, linear heads, tasks
    "vlm",  # vision-language models: image attention and answer changes under a fix
    "report",  # result schema, writers, figures
    "experiment",  # train-and-evaluate grids
    "configs",  # one typed config per verb
    "verbs",  # one library call per command: config in, run directory and typed result out
    "vitreg",  # the public API (vitreg/__init__.py)
    "cli",  # the typer app
)


def _unit(module: str, root: Path) -> str:
    """The layer of a dotted module name below ``root``: its first component, or the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else root.name


def _is_module(module: str, root: Path) -> bool:
    path = root.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(root: Path) -> Iterator[tuple[str, int, str, str]]:
    """Every import of ``root``'s own modules: (file, line, importing layer, imported module)."""
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[:-1]  # what a relative import of level 1 starts from
        if parts[-1] == "__init__":
            parts = parts[:-1]
        source = _unit(".".join(parts), root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                targets = [
                    f"{module}.{a.name}" if _is_module(f"{module}.{a.name}", root) else module
                    for a in node.names
                ]
            else:
                continue
            for target in dict.fromkeys(targets):
                if target.split(".")[0] == root.name:
                    yield str(path.relative_to(root.parent)), node.lineno, source, target


def violations(root: Path, layers: Sequence[str]) -> list[str]:
    """Imports of a higher layer (every cycle between layers has one) and unlisted layers."""
    rank = {name: i for i, name in enumerate(layers)}
    found = []
    for file, line, source, target in imports(root):
        dest = _unit(target, root)
        if dest == source:
            continue
        for unit in (source, dest):
            if unit not in rank:
                found.append(f"{file}:{line}: {unit!r} is in no layer; add it to LAYERS")
        if source in rank and dest in rank and rank[dest] > rank[source]:
            found.append(f"{file}:{line}: {source} imports {target}, a higher layer ({dest})")
    return sorted(set(found))


def test_vitreg_imports_only_point_down() -> None:
    found = violations(SRC, LAYERS)
    assert not found, "upward or unlisted imports:\n" + "\n".join(found)


def test_only_models_imports_an_adapter() -> None:
    """Adapters are reached through ``Model`` and its sites (a pattern site carries its reader)."""
    found = [
        f"{file}:{line}: {source} imports {target}"
        for file, line, source, target in imports(SRC)
        if target.startswith("vitreg.models.adapters") and source != "models"
    ]
    assert not found, "\n".join(found)


def test_every_package_and_module_has_a_layer() -> None:
    units = {p.stem if p.suffix else p.name for p in SRC.iterdir() if not p.name.startswith("_")}
    units = {u for u in units if _is_module(f"vitreg.{u}", SRC)} | {"vitreg"}
    assert units <= set(LAYERS), f"add {sorted(units - set(LAYERS))} to LAYERS"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


#: a planted package: ``low`` reaches up into ``high`` lazily and by a relative import
TREE = {
    "low/__init__.py": "",
    "low/a.py": "def f():\n    from pkg.high.b import g\n    return g\n",
    "low/c.py": "from ..high import b\n",
    "high/__init__.py": "from . import b\n",
    "high/b.py": "from .. import low\nimport pkg.low.a\n\ng = 1\n",
    "top.py": "from pkg import high\n",
}


def test_checker_flags_lazy_and_relative_upward_imports(tmp_path: Path) -> None:
    root = _package(tmp_path, TREE)
    assert violations(root, ("low", "high", "top", "pkg")) == [
        "pkg/low/a.py:2: low imports pkg.high.b, a higher layer (high)",
        "pkg/low/c.py:1: low imports pkg.high.b, a higher layer (high)",
    ]


def test_checker_flags_the_other_side_of_a_cycle_and_unlisted_layers(tmp_path: Path) -> None:
    root = _package(tmp_path, TREE)
    assert violations(root, ("high", "low")) == [
        "pkg/high/b.py:1: high imports pkg.low, a higher layer (low)",
        "pkg/high/b.py:2: high imports pkg.low.a, a higher layer (low)",
        "pkg/top.py:1: 'top' is in no layer; add it to LAYERS",
    ]
