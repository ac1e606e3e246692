"""Layers that only point down: every import between vitreg's packages goes to a lower layer;
inside a package, modules import each other without circles; no module imports another's
private (``_x``) name.

The order is written once, in :data:`LAYERS`. Imports inside functions (lazy imports) and under
``TYPE_CHECKING`` count too: the point is the direction of the dependency, not when it runs (a
lazy import hides a circle from Python, not from the reader). A helper two modules share goes
down into a module both import: a public name, or a private plumbing module (``_weights.py``,
timm's ``_builder.py``) whose names are public to its package.
A lower layer that needs something from a higher one offers a registry the higher one fills on
import (``models.load.LOADERS`` for ``planted:``, ``models.loaders.local.SECTIONS``
for a saved fix); the top-level ``vitreg/__init__.py`` imports the packages that register.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import vitreg

SRC = Path(vitreg.__file__).parent

#: vitreg's packages and top-level modules, lowest first; each may import only those before it
LAYERS = (
    "errors",  # exceptions
    "progress",  # the progress protocol library code reports through
    "device",  # the --device check
    "core",  # TokenLayout, atomic writers, run folders, the Registry, the version
    "settings",  # the config parts as plain typed data, passed whole to the library
    "results",  # every result model and the metrics.json envelope (schema, upgrade)
    "hooks",  # hook sites, names, reducers, activation cache, pattern readers
    "distributed",  # rank/world, sharding, merging reducers across ranks
    "models",  # loading (spec registry), adapters, Model
    "data",  # image folders, datasets, transforms, synthetic images
    "testing",  # planted fixtures (registers the planted: loader)
    "arch",  # trainable variants registered with timm
    "analysis",  # norms, outlier rules, attention, LN separation, redundancy
    "fix",  # NeuronSet and the fixes that edit its units (registers local: saved fixes)
    "neurons",  # discovery, causal selection, calibration of fixes, the automatic path
    "train",  # training loops
    "probe",  # feature cache, linear heads, tasks
    "vlm",  # vision-language models: image attention and answer changes under a fix
    "export",  # labelled activations written for other tools (safetensors, parquet, zarr)
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


class Edge(NamedTuple):
    """One import: where it is, the importing module, the imported module, the names it takes."""

    file: str
    line: int
    module: str
    target: str
    names: tuple[str, ...]


def edges(root: Path) -> Iterator[Edge]:
    """Every import of ``root``'s own modules, one per imported module (``from m import a, b``
    of plain names is one edge to ``m`` taking ``a`` and ``b``; a submodule is its own edge)."""
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[:-1]  # what a relative import of level 1 starts from
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts)
        file = str(path.relative_to(root.parent))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            found: dict[str, list[str]] = {}
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.setdefault(alias.name, [])
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                for a in node.names:
                    sub = f"{source}.{a.name}"
                    if _is_module(sub, root):
                        found.setdefault(sub, [])
                    else:
                        found.setdefault(source, []).append(a.name)
            for target, names in found.items():
                if target.split(".")[0] == root.name:
                    yield Edge(file, node.lineno, module, target, tuple(names))


def imports(root: Path) -> Iterator[tuple[str, int, str, str]]:
    """Every import of ``root``'s own modules: (file, line, importing layer, imported module)."""
    for e in edges(root):
        yield e.file, e.line, _unit(e.module, root), e.target


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


def circles(root: Path) -> list[str]:
    """Import circles among the modules of one package (layer), each as its sorted modules and
    the imports that close it (strongly connected components of the import graph)."""
    graph: dict[str, dict[str, str]] = {}
    for e in edges(root):
        if _unit(e.module, root) == _unit(e.target, root) and e.module != e.target:
            graph.setdefault(e.module, {}).setdefault(e.target, f"{e.file}:{e.line}")
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = set()
            while not members or v not in members:
                members.add(stack.pop())
            if len(members) > 1:
                where = sorted(
                    f"{graph[a][b]} ({a} -> {b})"
                    for a in members
                    for b in graph.get(a, {})
                    if b in members
                )
                found.append(f"{' <-> '.join(sorted(members))}: " + "; ".join(where))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def private_imports(root: Path) -> list[str]:
    """Private names (``_x``, not ``__x__``) imported from another module; a private module
    (``from pkg import _plumbing``) is fine, its names are its package's."""
    return sorted(
        f"{e.file}:{e.line}: {name} from {e.target}"
        for e in edges(root)
        for name in e.names
        if name.startswith("_") and not name.startswith("__")
    )


#: known cases left to the issue-19 rework of report/ (s3-report); an entry that no longer
#: occurs fails the tests below, so the list only shrinks
KNOWN_CIRCLES: set[str] = set()
KNOWN_PRIVATE: set[str] = set()


def test_no_import_circle_inside_a_package() -> None:
    found = {c.split(": ", 1)[0]: c for c in circles(SRC)}
    new = [c for key, c in found.items() if key not in KNOWN_CIRCLES]
    assert not new, "import circles (move the shared piece down into a module both import):\n" + (
        "\n".join(new)
    )
    assert KNOWN_CIRCLES <= set(found), (
        f"gone, drop from KNOWN_CIRCLES: {KNOWN_CIRCLES - set(found)}"
    )


def test_no_private_name_is_imported_from_another_module() -> None:
    found = {p.split(":", 1)[0] + ":" + p.split(":", 2)[2]: p for p in private_imports(SRC)}
    new = [p for key, p in found.items() if key not in KNOWN_PRIVATE]
    assert not new, (
        "private names imported across modules (make the name public with a docstring, or move "
        "it into a private plumbing module whose names are public):\n" + "\n".join(new)
    )
    assert KNOWN_PRIVATE <= set(found), (
        f"gone, drop from KNOWN_PRIVATE: {KNOWN_PRIVATE - set(found)}"
    )


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


#: what the CLI may import besides its own modules: typer wiring and printing only
CLI_READS = ("verbs", "configs", "progress", "errors", "cli", "vitreg")  # vitreg: __version__


def test_the_cli_imports_only_verbs_configs_progress_and_errors() -> None:
    found = [
        f"{file}:{line}: cli imports {target}"
        for file, line, source, target in imports(SRC)
        if source == "cli" and _unit(target, SRC) not in CLI_READS
    ]
    assert not found, "the CLI reaches the library through vitreg.verbs:\n" + "\n".join(found)


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


#: a planted package: a lazy circle in ``a``, a three-module circle in ``b``, private imports
CIRCLES = {
    "a/__init__.py": "",
    "a/x.py": "from pkg.a.y import g\n\ndef f():\n    return g\n",
    "a/y.py": "def g():\n    from pkg.a import x\n    return x\n",
    "a/z.py": "from pkg.a.x import f\nfrom pkg.a.y import g\n",  # imports both, in no circle
    "b/__init__.py": "",
    "b/p.py": "from .q import h\n",
    "b/q.py": "from . import r\nh = 1\n",
    "b/r.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b.p import h\n",
    "b/_plumbing.py": "def shared():\n    return 1\n\ndef _own():\n    return 2\n",
    "b/s.py": "from pkg.b import _plumbing\nfrom pkg.b._plumbing import _own, shared\n",
    "c.py": "from pkg.a.x import _hidden, f\nfrom .b.q import __doc__\n",
}


def test_checker_flags_lazy_and_type_checking_circles_inside_a_package(tmp_path: Path) -> None:
    root = _package(tmp_path, CIRCLES)
    assert circles(root) == [
        "pkg.a.x <-> pkg.a.y: pkg/a/x.py:1 (pkg.a.x -> pkg.a.y); pkg/a/y.py:2 (pkg.a.y -> pkg.a.x)",
        "pkg.b.p <-> pkg.b.q <-> pkg.b.r: pkg/b/p.py:1 (pkg.b.p -> pkg.b.q); "
        "pkg/b/q.py:1 (pkg.b.q -> pkg.b.r); pkg/b/r.py:3 (pkg.b.r -> pkg.b.p)",
    ]


def test_checker_flags_private_names_but_not_private_modules(tmp_path: Path) -> None:
    root = _package(tmp_path, CIRCLES)
    assert private_imports(root) == [
        "pkg/b/s.py:2: _own from pkg.b._plumbing",
        "pkg/c.py:1: _hidden from pkg.a.x",
    ]
