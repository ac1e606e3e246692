"""The one metrics.json document of every verb: the envelope (versions, command, model, images,
config, creation time) around the verb's ``results``, and its headline numbers, each a
:class:`Headline` naming the JSON pointer of the value it repeats, so that a reader (and the
schema) can check every headline against ``results``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from vitreg.results.schema import (
    SCHEMA_VERSION,
    data_info,
    model_info,
    plain,
    resolve,
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

    def metric(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The metrics.json entry of this headline, its value read from ``doc``."""
        entry: dict[str, Any] = {
            "name": self.name,
            "value": resolve(doc, self.pointer, self.aggregate),
            "higher_is_better": self.higher_is_better,
            "source": self.pointer,
        }
        extra = {"unit": self.unit, "layer": self.layer, "aggregate": self.aggregate}
        entry |= {k: v for k, v in extra.items() if v is not None}
        if self.description:
            entry["description"] = self.description
        return entry


def headline_values(results: dict[str, Any], headlines: list[Headline]) -> dict[str, Any]:
    """Each headline's value read from ``results`` (a document's results block), by name."""
    doc = {"results": results}
    return {h.name: resolve(doc, h.pointer, h.aggregate) for h in headlines}


def build_document(
    verb: str,
    results: Any,
    headlines: list[Headline],
    *,
    command: str,
    described: dict[str, Any],
    data: dict[str, Any],
    config: dict[str, Any],
) -> dict[str, Any]:
    """The validated metrics.json document of one ``verb`` run (``results`` made JSON-ready,
    ``described`` as ``Model.describe()`` gives it, ``data`` the images' description)."""
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "verb": verb,
        **versions(),
        "created": utc_now(),
        "command": command,
        "model": model_info(described),
        "data": data_info(data),
        "config": plain(config),
        "results": plain(results),
    }
    doc["metrics"] = [h.metric(doc) for h in headlines]
    return validate_metrics(doc).model_dump(mode="json")
