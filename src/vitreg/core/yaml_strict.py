"""Checks of a YAML config that PyYAML's loader lets pass: a key given twice in one mapping
(the last would win silently) and ``true``/``false`` where a number is expected."""

from __future__ import annotations

import types
import typing
from pathlib import Path

from vitreg.errors import InputError

if typing.TYPE_CHECKING:
    from pydantic.fields import FieldInfo


def duplicate_key(text: str) -> tuple[str, int] | None:
    """The first key given twice in one mapping of the YAML ``text`` and its line (1-based), or
    None. Composes nodes only (aliases stay shared), so call it on text the budgeted reader
    has already accepted."""
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else None
                if name is not None and name in seen:
                    return name, key.start_mark.line + 1
                if name is not None:
                    seen.add(name)
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def refuse_duplicate_keys(path: Path, what: str) -> None:
    """An :class:`InputError` naming the key when the YAML file ``path`` gives one key twice."""
    found = duplicate_key(path.read_text(encoding="utf-8"))
    if found is not None:
        key, line = found
        raise InputError(
            f"{what} {str(path)!r} gives the key {key[:60]!r} twice in one mapping (again on "
            f"line {line}); YAML readers disagree on which one wins, so vitreg refuses it: "
            "keep one"
        )


def _numbers_only(annotation: object) -> bool:
    """True when ``annotation`` admits int or float but not bool (Optional and Annotated
    unwrapped)."""
    kinds: set[object] = set()
    stack = [annotation]
    while stack:
        a = stack.pop()
        origin = typing.get_origin(a)
        if origin is typing.Annotated:
            stack.append(typing.get_args(a)[0])
        elif origin in (typing.Union, types.UnionType):
            stack.extend(typing.get_args(a))
        else:
            kinds.add(a)
    return bool(kinds & {int, float}) and bool not in kinds and typing.Any not in kinds


def refuse_bool_numbers(flags: dict[str, bool], fields: dict[str, FieldInfo], where: str) -> None:
    """An :class:`InputError` naming the key when ``true``/``false`` (``flags``, the boolean
    values of a config) is given for a setting whose field is a number: pydantic would take
    YAML's booleans as 1 and 0."""
    for key, value in flags.items():
        field = fields.get(key)
        if field is not None and _numbers_only(field.annotation):
            raise InputError(
                f"{where}: {key} is {str(value).lower()}, but {key} is a number; give a "
                f"number (or remove the line for the default)"
            )
