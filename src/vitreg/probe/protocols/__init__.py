"""Each CLIP-fix method's own ov-seg settings per benchmark (``published.yaml``, read from the
official repositories' evaluation configs, each entry with its ``repo@commit path:lines``) and
the rule that fits them to a loaded model.

A benchmark is named by its data set reader (``voc:`` is VOC21, ``voc20:``, ``context60:``,
``context59:``, ``coco-object:``, ``coco-stuff:``, ``cityscapes:``, ``ade20k:``); any other set
(``synthetic-seg``, an image folder) has no published settings and the published protocol
refuses it by name. A vitreg model takes one input size, so a published crop of another size
(ClearCLIP's 448 px on a 224 px ViT-B/16) or whole-image inference (NACLIP on VOC) runs at the
model's size with the published stride-to-crop ratio, and the record says so."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from vitreg.core.readers import read_yaml
from vitreg.errors import InputError
from vitreg.results.probe import OvSegProtocolRecord
from vitreg.settings.ov_seg import (
    PROTOCOLS,
    OvSegSettings,
    ProtocolName,
    PublishedEntry,
    PublishedMethod,
    PublishedProtocols,
)

PUBLISHED_FILE = Path(__file__).with_name("published.yaml")
BENCHMARKS = (
    "voc21", "voc20", "context60", "context59", "coco-object", "coco-stuff", "cityscapes",
    "ade20k",
)  # fmt: skip
READERS = {"voc": "voc21"}  # a data set reader named otherwise than its benchmark


class UnknownProtocolError(InputError):
    """A protocol other than ``shared`` and ``published``."""


class UnknownBenchmarkError(InputError):
    """A data set that is none of the published benchmarks."""


@cache
def published() -> PublishedProtocols:
    """The shipped data file, parsed and checked (every entry with its source)."""
    return PublishedProtocols.model_validate(read_yaml(PUBLISHED_FILE, "published ov-seg settings"))


def protocol_named(name: str | None) -> ProtocolName:
    """``name`` as a protocol (None: ``shared``)."""
    if name is None or name == "shared":
        return "shared"
    if name == "published":
        return "published"
    raise UnknownProtocolError(
        f"ov-seg protocol {name!r} is unknown; choose {' or '.join(PROTOCOLS)}"
    )


def benchmark_of(dataset: str) -> str:
    """The benchmark a data set reader's name stands for, or :class:`UnknownBenchmarkError`."""
    benchmark = READERS.get(dataset, dataset)
    if benchmark not in BENCHMARKS:
        readers = {b: r for r, b in READERS.items()}
        known = ", ".join(
            f"{readers.get(b, b)}: ({b})" if b in readers else f"{b}:" for b in BENCHMARKS
        )
        raise UnknownBenchmarkError(
            f"--protocol published needs one of the published benchmarks, read by {known}; "
            f"{dataset!r} is none of them (run it with --protocol shared)"
        )
    return benchmark


def published_entry(
    method: str | None, benchmark: str
) -> tuple[PublishedMethod, PublishedEntry] | None:
    """``method``'s repository and its entry for ``benchmark``; None when it publishes none."""
    found = published().methods.get(method or "")
    if found is None or benchmark not in found.benchmarks:
        return None
    return found, found.benchmarks[benchmark]


def fitted(entry: OvSegSettings, crop: int) -> tuple[OvSegSettings, list[str]]:
    """``entry`` as a model taking ``crop`` px squares runs it, and what had to change: a crop
    of another size (or whole-image inference) becomes ``crop`` at the published stride ratio."""
    if entry.slide_crop == crop:
        return entry, []
    ratio = entry.slide_stride / (entry.slide_crop or 2 * entry.slide_stride)
    stride = max(1, round(crop * ratio))
    asked = (
        "whole-image inference (slide_crop 0) needs a model that takes any input size"
        if entry.slide_crop == 0
        else f"slide crop {entry.slide_crop} px needs the model built for that input size "
        f"(load it with --img-size {entry.slide_crop})"
    )
    used = entry.model_copy(update={"slide_crop": crop, "slide_stride": stride})
    return used, [f"{asked}; this model takes {crop} px: ran {crop} px crops, stride {stride} px"]


def record(
    protocol: ProtocolName,
    method: str | None,
    benchmark: str,
    shared: OvSegSettings,
    crop: int,
) -> OvSegProtocolRecord:
    """The settings a condition runs with under ``protocol``: ``method``'s published entry for
    ``benchmark`` fitted to a ``crop`` px model, else ``shared`` with the reason."""
    found = published_entry(method, benchmark) if protocol == "published" else None
    if found is None:
        who = "the unfixed model" if method is None else f"{method} (no published settings)"
        note = None if protocol == "shared" else f"{who} runs the shared protocol's settings"
        return OvSegProtocolRecord(
            protocol=protocol, benchmark=benchmark, method=None, settings=shared, note=note
        )
    repo, entry = found
    used, deviations = fitted(entry, crop)
    return OvSegProtocolRecord(
        protocol=protocol,
        benchmark=benchmark,
        method=method,
        source=entry.source,
        commit=repo.commit,
        attention=entry.attention,
        settings=OvSegSettings.model_validate(
            used.model_dump(include=set(OvSegSettings.model_fields))
        ),
        deviations=deviations,
        note=repo.note,
    )


def protocol_note(r: OvSegProtocolRecord) -> str:
    """One line saying which settings a condition ran with and where they come from."""
    s = r.settings
    knobs = (
        f"logit scale {s.logit_scale:g}, prob thd {s.prob_thd:g}, area thd {s.area_thd}, short "
        f"side {s.short_side}, crop {s.slide_crop} stride {s.slide_stride}, PAMR {s.pamr_steps}"
        f"{f' at {list(s.pamr_dilations)}' if s.pamr_steps else ''}, names {s.names}"
    )
    if r.method is None:
        return f"protocol {r.protocol} on {r.benchmark}: {r.note}: {knobs}"
    extra = "".join(f"; {t}" for t in [*r.deviations, *([r.note] if r.note else [])])
    where = f"{r.method}'s settings for {r.benchmark} ({r.source})"
    return f"protocol {r.protocol}: {where}: {knobs}{extra}"
