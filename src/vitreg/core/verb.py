"""One record per verb: its typed config, the library call that runs it, the results model its
metrics.json holds, its renderer, whether it resumes, and its one-line help. Each verb registers
its record once, beside its code in :mod:`vitreg.verbs`; every table of verbs (the CLI's
commands, config.yaml's reader, the metrics.json schema, ``vitreg report``'s renderers, the run
folders that resume) is read from :data:`VERBS`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from vitreg.core.registry import Registry


@dataclass
class Verb:
    """A command of vitreg, as data (its name is its config's ``verb``).

    ``run(config, progress, on_notice)`` runs it and returns its result; ``results`` is the
    model of the ``results`` block its metrics.json holds (``None``: it writes no metrics.json);
    ``renderer`` the module (imported when first used) whose ``report(document, figures)`` draws
    its report and ``headlines(results)`` its headline metrics; ``resumes`` that a rerun into its
    own folder continues it; ``argument`` the config fields the command line takes by position;
    ``flags`` option spellings other than ``--field-name``; ``group`` the command group it sits
    under (``vitreg experiment variants``: group ``experiment``, ``command`` ``variants``)."""

    config: type
    run: Callable[..., Any]
    help: str
    results: type | None = None
    renderer: str | None = None
    resumes: bool = False
    argument: tuple[str, ...] = ()
    flags: dict[str, str] = field(default_factory=dict)
    group: str | None = None
    command: str | None = None

    @property
    def name(self) -> str:
        """The verb's name: its config's ``verb``."""
        return self.config.verb

    @property
    def words(self) -> tuple[str, ...]:
        """How the command line names it: ``("neurons",)``, ``("experiment", "variants")``."""
        return (self.group, self.command or self.name) if self.group else (self.name,)

    def render_module(self) -> ModuleType:
        """The renderer module (``InputError`` for a verb that renders no report)."""
        if self.renderer is None:
            from vitreg.errors import InputError

            raise InputError(f"`vitreg {self.name}` writes no report to render")
        return importlib.import_module(self.renderer)


#: every verb, filled by :mod:`vitreg.verbs` when first read
VERBS: Registry[Verb] = Registry("verbs")


def register(verb: Verb) -> Verb:
    """Add ``verb`` to :data:`VERBS` under its name; the record is returned."""
    VERBS.register(verb.name, verb)
    return verb


def reporting() -> dict[str, Verb]:
    """The verbs that write a metrics.json (those with a results model), by name."""
    return {name: v for name, v in VERBS.items() if v.results is not None}
