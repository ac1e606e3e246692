"""The one metrics.json document of every verb: the envelope (versions, command, model, images,
config, creation time) around the verb's ``results``, and its headline numbers, each a
:class:`Headline` naming the JSON pointer of the value it repeats, so that a reader (and the
schema) can check every headline against ``results``.

A document is validated once, when it is built: :func:`build_document` types the results by the
verb's results model, and the envelope around them, and gives the verb's document model; the
writer, the renderer and its figures read that typed document, and the writer turns it into
JSON once, for the file."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, JsonValue

from vitreg.results.schema import (
    SCHEMA_VERSION,
    DataInfo,
    Envelope,
    Metric,
    ModelInfo,
    Number,
    plain,
    resolve,
    results_model,
    utc_now,
    validate_metrics,
    versions,
)


@dataclass(frozen=True)
class Headline:
    """One headline number of a verb: its name, the JSON pointer of its value in the document
    (``*`` segments with an ``aggregate``), which direction is better, and what it means."""

    name: str
    pointer: str
    higher_is_better: bool | None
    description: str = ""
    unit: str | None = None
    layer: int | None = None
    aggregate: Literal["mean"] | None = None

    def metric(self, results: JsonValue) -> Metric:
        """The metrics.json entry of this headline, its value read from ``results`` (a
        document's results block, JSON-ready)."""
        return Metric(
            name=self.name,
            value=resolve({"results": results}, self.pointer, self.aggregate),
            higher_is_better=self.higher_is_better,
            unit=self.unit,
            layer=self.layer,
            description=self.description,
            source=self.pointer,
            aggregate=self.aggregate,
        )


#: a verb's headlines: given, or read off its typed results
Headlines = Sequence[Headline] | Callable[[Any], Sequence[Headline]]


def headline_values(results: JsonValue, headlines: list[Headline]) -> dict[str, Number]:
    """Each headline's value read from ``results`` (a document's results block), by name."""
    doc = {"results": results}
    return {h.name: resolve(doc, h.pointer, h.aggregate) for h in headlines}


def typed_results(verb: str, results: Any) -> Any:
    """``results`` (JSON-ready) typed by ``verb``'s results model: the one validation a
    document's results go through (:func:`build_document` does it, unless given them typed)."""
    return results_model(verb).model_validate(results)


def build_document(
    verb: str,
    results: Any,
    headlines: Headlines,
    *,
    command: str,
    described: ModelInfo,
    data: DataInfo,
    config: dict[str, JsonValue],
    typed: BaseModel | None = None,
) -> Envelope:
    """The metrics.json document of one ``verb`` run, validated once: the verb's document model.
    ``results`` are made JSON-ready and typed by the verb's results model (``typed``: the same
    results already typed, by :func:`typed_results`); ``headlines`` are given or
    ``headlines(typed results)``, each value read from ``results``; ``described`` the model
    block (:func:`~vitreg.results.schema.model_info` of ``Model.describe()``), ``data`` the
    images' (:func:`~vitreg.results.schema.data_info`)."""
    results = plain(results)
    typed = typed if typed is not None else typed_results(verb, results)
    marks = headlines(typed) if callable(headlines) else headlines
    return validate_metrics(
        {
            "schema_version": SCHEMA_VERSION,
            "verb": verb,
            **versions(),
            "created": utc_now(),
            "command": command,
            "model": described,
            "data": data,
            "config": plain(config),
            "results": typed,  # the typed results are taken as they are
            "metrics": [h.metric(results) for h in marks],
        }
    )
