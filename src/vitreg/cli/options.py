"""The options of every verb, generated from its typed config (:mod:`vitreg.configs`): each field
is an option whose default, help and type come from the field, so that a setting reads and
behaves the same in every verb, in config.yaml and in the library, and cannot drift."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from rich.markup import escape

from vitreg.verbs import Verb

CONFIG = typer.Option(
    None,
    "--config",
    help="A run's config.yaml: rerun with its settings (options given here override them).",
)
REQUIRED = "Required unless --config gives it."
PLAIN = (bool, int, float, str, Path)  # the types the command line parses itself


def _plain(annotation: Any) -> Any:
    """What the command line parses a field as: its own type where click has it (``int``,
    ``Path``, a repeated ``list[str]``, ...), else text that the config validates (literals,
    unions of words and numbers, neuron sources, comma-separated numbers); optional, so that an
    unset option is ``None``."""
    if get_origin(annotation) is Annotated:  # PositiveInt and the like
        return _plain(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _plain(args[0]) if len(args) == 1 else str | None
    if annotation is bool:
        return bool
    if get_origin(annotation) is list:  # KEY=VALUE pairs repeat; numbers are comma-separated
        return list[str] | None if get_args(annotation) == (str,) else str | None
    if annotation in PLAIN:
        return annotation | None
    return str | None


def _help(field: FieldInfo, verb: str, cls: type | None = None) -> str:
    """The field's description, with its verb filled in and, without a default, that it is
    required (unless ``--config`` gives it, for a verb that has one)."""
    text = (field.description or "").replace("<verb>", verb)
    if not field.is_required() or (cls is not None and not _writes_config(cls)):
        return text
    return f"{text} {REQUIRED}"


def field_option(cls: type[BaseModel], name: str, flags: str | None = None, verb: str = "") -> Any:
    """The typer option of ``cls``'s field ``name``: ``--name-with-dashes`` (``--x/--no-x`` for
    a switch that is on by default; ``flags`` to name it otherwise), its default and its help."""
    field = cls.model_fields[name]
    default = None if field.is_required() else field.get_default(call_default_factory=True)
    if default == []:  # an empty list: unset, the config's default
        default = None
    flag = "--" + name.replace("_", "-")
    if flags is None and default is True:
        flags = f"{flag}/--no-{flag[2:]}"
    return typer.Option(
        str(default) if isinstance(default, str) else default,
        flags or flag,
        help=_help(field, verb),
    )


def verb_command(verb: Verb, show: Callable[[Any, Any], None]) -> Callable[..., None]:
    """The typer command of ``verb`` (its options from its config): it runs the verb with the
    console's progress and notices, then ``show(result, config)`` prints the summary."""

    def run(cfg: Any) -> None:
        from vitreg.cli.output import cli_errors, err_console, show_notice
        from vitreg.cli.progress import progress
        from vitreg.verbs import Interrupted

        try:
            with cli_errors():
                result = verb.run(cfg, progress, show_notice)
        except Interrupted as e:
            err_console.print(f"[red]interrupted: {escape(e.what_is_kept())}[/red]")
            raise typer.Exit(code=130) from None
        show(result, cfg)

    return config_command(verb.config, run, verb.help, verb.argument, verb.flags)


def config_command(
    cls: type[BaseModel],
    run: Callable[[Any], None],
    doc: str,
    argument: tuple[str, ...] = (),
    flags: dict[str, str] | None = None,
) -> Callable[..., None]:
    """A typer command for the verb of ``cls``: the ``argument`` fields given by position (the
    model spec, the runs to compare), one option per other field, and ``--config`` for a verb
    that writes config.yaml; it builds the typed config (options on top of ``--config``'s) and
    calls ``run`` with it."""
    verb = getattr(cls, "verb", "")
    params = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    ]
    for name, field in cls.model_fields.items():
        if name in argument:
            default, annotation = _argument(cls, name, verb)
        else:
            default = field_option(cls, name, (flags or {}).get(name), verb)
            annotation = _plain(field.annotation)
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    if _writes_config(cls):
        params.append(
            inspect.Parameter(
                "config", inspect.Parameter.KEYWORD_ONLY, default=CONFIG, annotation=Path | None
            )
        )

    def command(ctx: typer.Context, **values: Any) -> None:
        from vitreg.cli.output import cli_errors

        config = values.pop("config", None)
        given = {k: v for k, v in values.items() if v is not None}  # unset: the config's default
        with cli_errors():
            cfg = resolve_config(ctx, cls, config, given)
        run(cfg)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {}
    command.__doc__ = doc
    command.__name__ = f"{verb}_command"
    return command


def _argument(cls: type[BaseModel], name: str, verb: str) -> tuple[Any, Any]:
    """A positional argument's default and type: required where nothing else can give it (a
    required field of a verb without ``--config``); a list field takes one or more values."""
    field = cls.model_fields[name]
    required = field.is_required() and not _writes_config(cls)
    many = _is_list(field.annotation)
    default = typer.Argument(
        ... if required else None,
        help=_help(field, verb, cls),
        show_default=False,
        metavar=name.upper() + ("..." if many else ""),
    )
    kind: Any = list[str] if many else str
    return default, kind if required else kind | None


def _is_list(annotation: Any) -> bool:
    return get_origin(annotation) is list


def _writes_config(cls: type) -> bool:
    """Whether ``cls`` is a run's config (written as config.yaml, read back by ``--config``)."""
    return hasattr(cls, "to_file")


def resolve_config(
    ctx: typer.Context, cls: type, config: object | None, params: dict[str, object]
) -> object:
    """The verb's typed config from the command's options, or from ``--config`` with the options
    given on the command line on top; raises ``InputError`` naming each wrong field."""
    from vitreg.configs import build_config, read_config

    values = {k: v for k, v in params.items() if k in cls.model_fields}
    if config is None:  # a verb without --config never has one
        return build_config(cls, values, "bad option", flags=True)
    given = {
        k: v
        for k, v in values.items()
        # by name: typer may vendor its own click, whose enum is not click's
        if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"
    }
    merged = {**read_config(config, cls.verb), **given}
    return build_config(cls, merged, f"--config {config} (or the options given with it)")
