"""The one reader of JSON and of YAML files vitreg did not necessarily write itself (run files,
configs, model folders): size, depth, alias and node budgets are checked while reading, so a
hostile file is an :class:`InputError` naming it, never a hang, a RecursionError or a message
that prints the whole expanded structure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitreg.errors import InputError

MAX_DEPTH = 64  # nesting of lists and mappings; vitreg's own files stay under 12
MAX_NODES = 1_000_000  # values in one document, aliases expanded
MAX_ALIASES = 100  # YAML aliases (*name) in one document; vitreg writes none
MAX_YAML_NODES = 100_000  # a config holds a few dozen values


def check_shape(
    obj: Any, where: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES
) -> Any:
    """``obj`` if it nests at most ``max_depth`` levels and holds at most ``max_nodes`` values
    (shared sub-structures counted each time they appear); an :class:`InputError` naming
    ``where`` otherwise. Iterative, so it cannot itself exceed the recursion limit."""
    stack, nodes = [(obj, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise InputError(
                f"{where} holds more than {max_nodes:,} values (aliases expanded); vitreg "
                "files hold far fewer, so this is not one"
            )
        if isinstance(node, dict | list):
            if depth > max_depth:
                raise InputError(
                    f"{where} nests more than {max_depth} levels deep; vitreg files nest a few "
                    "levels, so this is not one"
                )
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return obj


def _read_text(path: Path, what: str, max_bytes: int) -> str:
    """The UTF-8 text of ``path``, refused when larger than ``max_bytes``."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(
                f"{what} {str(path)!r} is {size / 2**20:.1f} MiB; a {what} is at most "
                f"{max_bytes / 2**20:.0f} MiB, so this is not one"
            )
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{what} {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    except IsADirectoryError:
        raise InputError(f"{what} {str(path)!r} is a folder, not a file") from None
    except OSError as e:
        raise InputError(f"could not read {what} {str(path)!r}: {e.strerror or e}") from None


def read_json(
    path: str | Path,
    what: str,
    max_bytes: int = 64 * 2**20,
    allow_nan: bool = False,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """The JSON in ``path``, or an :class:`InputError` naming the file: unreadable, too large, not
    UTF-8, not JSON, nested too deeply, a key given twice in one object, or (unless
    ``allow_nan``) NaN/Infinity."""
    path = Path(path)

    class _Twice(Exception):
        pass

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise _Twice(k)
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number; write a finite number")

    text = _read_text(path, what, max_bytes)
    try:
        if allow_nan:
            value = json.loads(text, object_pairs_hook=pairs)
        else:
            value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except _Twice as e:
        raise InputError(
            f"{what} {str(path)!r} gives the key {str(e.args[0])[:60]!r} twice in one object; "
            "JSON readers disagree on which one wins, so vitreg refuses it: keep one"
        ) from None
    except RecursionError:
        raise InputError(
            f"{what} {str(path)!r} nests more than {max_depth} levels deep; vitreg files nest "
            "a few levels, so this is not one"
        ) from None
    except ValueError as e:  # JSONDecodeError, NaN, an integer longer than Python converts
        raise InputError(f"{what} {str(path)!r} is not valid JSON: {str(e)[:200]}") from None
    # JSON has no aliases: its values are bounded by its bytes, so only the depth is checked
    return check_shape(value, f"{what} {str(path)!r}", max_depth, max_nodes=max_bytes)


def read_yaml(
    path: str | Path,
    what: str,
    max_bytes: int = 2**20,
    max_depth: int = MAX_DEPTH,
    max_aliases: int = MAX_ALIASES,
    max_nodes: int = MAX_YAML_NODES,
) -> Any:
    """The YAML in ``path`` read with PyYAML's safe loader under budgets: at most ``max_bytes``,
    ``max_depth`` levels, ``max_aliases`` aliases and ``max_nodes`` values once expanded
    (an alias bomb stops at the budget instead of hanging); an :class:`InputError` naming the
    file otherwise."""
    import yaml

    path = Path(path)
    where = f"{what} {str(path)!r}"

    class _Budget(Exception):
        pass

    class Loader(yaml.SafeLoader):
        """The safe loader, counting aliases and nesting while it composes."""

        aliases = 0
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > max_aliases:
                    raise _Budget(f"uses more than {max_aliases} aliases (*name)")
            self.depth += 1
            try:
                if self.depth > max_depth:
                    raise _Budget(f"nests more than {max_depth} levels deep")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    text = _read_text(path, what, max_bytes)
    try:
        value = yaml.load(text, Loader=Loader)  # noqa: S506  # a SafeLoader subclass
    except _Budget as e:
        raise InputError(
            f"{where} {e}; vitreg configs use none of that, so this is not one"
        ) from None
    except yaml.YAMLError as e:
        raise InputError(f"{where} is not YAML: {str(e).splitlines()[0][:200]}") from None
    except (ValueError, RecursionError, OverflowError) as e:  # e.g. an integer of 5000 digits
        raise InputError(f"{where} holds a value YAML cannot read: {str(e)[:200]}") from None
    return check_shape(value, where, max_depth, max_nodes)
