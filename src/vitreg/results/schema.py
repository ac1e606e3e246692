"""The metrics.json schema of every verb: one envelope (verb, command, versions, model, data,
config, creation time, headline metrics) around a ``results`` block typed per verb.

Every headline metric names the JSON pointer (``source``) of the number it repeats inside the
same file, with an optional aggregate over a ``*`` wildcard, so a reader (and
:func:`validate_metrics`) can check that each headline equals a number in ``results``.
Version 2.0 types every results field (``results/``); 1.1 and 1.0 files are read as
2.0 by :func:`vitreg.results.upgrade.upgrade`, so old runs still validate and compare.
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import math
import platform
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    create_model,
    field_validator,
    model_validator,
)

from vitreg.core.verb import reporting
from vitreg.core.weights import WeightKind
from vitreg.errors import brief
from vitreg.results.base import ReadByKey, Stamp
from vitreg.results.upgrade import upgrade

SCHEMA_VERSION = "2.0"
Number = bool | int | float | None


class Metric(BaseModel):
    """One headline number, where it sits in ``results`` and which direction is better."""

    model_config = ConfigDict(extra="forbid")

    name: str
    value: Number
    higher_is_better: bool | None
    unit: str | None = None
    layer: int | None = None
    description: str = ""
    source: str = Field(description="JSON pointer into this file; '*' matches every list item")
    aggregate: Literal["mean"] | None = None

    @field_validator("value")
    @classmethod
    def _finite(cls, v: Number) -> Number:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("metric values must be finite numbers or null")
        return v


class ModelInfo(BaseModel):
    """What was analysed: spec, family, token layout, dimensions, attention path, notes."""

    model_config = ConfigDict(extra="allow")

    spec: str | None
    family: str
    source: str | None = None
    class_name: str | None = None
    synthetic: bool
    # where the weights come from (Model.weights); absent in runs written before it was recorded
    weights: WeightKind | None = None
    layout: dict[str, Any]
    dims: dict[str, int | None]
    image_size: list[int] | None = None
    attention: str | None = None
    notes: list[str] = Field(default_factory=list)


#: the dimensions metrics.json's model block groups under ``dims``
DIMS = ("n_layers", "d_model", "d_mlp", "n_heads", "n_params")


class ModelDescription(ReadByKey):
    """What ``Model.describe()`` says of a wrapped model, in the order the feature cache's
    manifest (and its hashed identity) and ``vitreg inspect`` write it; :func:`model_info`
    regroups it as metrics.json's model block. A description read from an older file may lack
    fields (None) and hold others (kept as extras)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    key_read_warning: ClassVar[str] = (
        "Model.describe() returns a ModelDescription: read its fields (describe().spec); "
        "item access goes in the next release"
    )

    spec: str | None = None
    weights: WeightKind | None = None
    family: str = "unknown"
    source: str | None = None
    class_name: str | None = Field(None, alias="class", description="the module's class")
    n_layers: int | None = None
    d_model: int | None = None
    d_mlp: int | None = None
    n_heads: int | None = None
    n_params: int | None = None
    image_size: list[int] | None = None
    layout: dict[str, int | list[int] | None] = Field(default_factory=dict)
    attention: str | None = None
    supports_insertion: bool | None = None
    notes: list[str] = Field(default_factory=list)


class DataInfo(BaseModel):
    """Which images: description, how many were used, which files were skipped or converted."""

    model_config = ConfigDict(extra="allow")

    description: str | None = None
    n_images: int
    skipped: dict[str, str] = Field(default_factory=dict)
    converted: dict[str, str] = Field(default_factory=dict)


class Envelope(Stamp):
    """What every metrics.json holds around its verb's results: versions and creation time
    (as leaderboard.json), command, model, images, config and the headline metrics (each
    traced into ``results``)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal["2.0"]
    command: str
    model: ModelInfo
    data: DataInfo
    config: dict[str, Any] = Field(description="the resolved config the run was made with")
    metrics: list[Metric]
    if TYPE_CHECKING:  # each verb's document model (documents()) declares both
        verb: str
        results: Any

    @model_validator(mode="after")
    def _traceable(self) -> Envelope:
        doc = self.model_dump(mode="json")
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            raise ValueError("metric names must be unique")
        for m in self.metrics:
            expected = resolve(doc, m.source, m.aggregate)
            if not _same(m.value, expected):
                raise ValueError(
                    f"metric {brief(m.name, 120)}={m.value!r} differs from "
                    f"{brief(m.source, 120)} = {brief(expected)}"
                )
        return self


class Headline(BaseModel):
    """A headline metric as read back from a run's metrics.json, whether or not the run
    follows the schema: the fields a reader uses, typed; the rest kept as read."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=True)

    name: str
    value: Number = None
    higher_is_better: bool | None = None
    source: str | None = None
    aggregate: str | None = None
    layer: int | None = None


class RunDocument(BaseModel):
    """A run's metrics.json as read back (compared, validated): the envelope fields a reader
    uses, typed, and every other field kept as read; :attr:`read` is the file's JSON object."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=True)

    verb: str | None = None
    command: str | None = None
    model: dict[str, JsonValue] | None = None
    data: dict[str, JsonValue] | None = None
    config: dict[str, JsonValue] | None = None
    results: dict[str, JsonValue] | None = None
    metrics: list[Headline]

    @functools.cached_property
    def read(self) -> dict[str, JsonValue]:
        """The document's JSON object as read (the fields it holds, none added)."""
        return self.model_dump(exclude_unset=True)

    @property
    def spec(self) -> JsonValue:
        """The model spec the run names (None where its model block names none)."""
        return (self.model or {}).get("spec")


def _document(verb: str, results: type[BaseModel]) -> type[Envelope]:
    """The metrics.json model of one verb: the envelope with ``verb`` and its results type."""
    name = f"{verb.capitalize()}Document"
    doc = f"metrics.json of a `vitreg {verb}` run."
    return create_model(  # type: ignore[call-overload, no-any-return]
        name,
        __base__=Envelope,
        __doc__=doc,
        verb=(Literal[verb], ...),
        results=(results, ...),
    )


@functools.cache
def documents() -> dict[str, type[Envelope]]:
    """The metrics.json model of every verb that writes one (from its record), by verb."""
    return {name: _document(name, v.results) for name, v in reporting().items()}


def results_model(verb: str) -> type[BaseModel]:
    """The model of the ``results`` block of ``verb``'s metrics.json (its record's)."""
    return reporting()[verb].results  # type: ignore[return-value]


@functools.cache
def _file() -> TypeAdapter[Any]:
    """Any verb's metrics.json, told apart by ``verb``."""
    union = Union[tuple(documents().values())]  # noqa: UP007
    return TypeAdapter(Annotated[union, Field(discriminator="verb")])


def __getattr__(name: str) -> Any:
    """``VERBS``: the verbs that write a metrics.json, in order, read from the verb records when
    first asked for."""
    if name == "VERBS":
        return tuple(documents())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def json_schema() -> dict[str, JsonValue]:
    """The JSON Schema of metrics.json (for consumers in other languages): one document type
    per verb, told apart by ``verb``, with every results field described."""
    schema = _file().json_schema()
    schema["title"] = f"vitreg metrics.json (schema {SCHEMA_VERSION})"
    return schema


def validate_metrics(doc: Any) -> Envelope:
    """Validate a metrics.json document (a 1.0 or 1.1 one read as 2.0), including that every
    headline traces to ``results``; the verb's document model."""
    return _file().validate_python(upgrade(doc))  # type: ignore[no-any-return]


def resolve(doc: Any, pointer: str, aggregate: str | None = None) -> Any:
    """The value at JSON ``pointer`` in ``doc``; with ``*`` segments, ``aggregate`` of the matches.
    A pointer that leads nowhere (a missing key, an index out of range, into a number) or an
    aggregate over values that are not numbers is a ValueError naming the pointer."""
    try:
        return _resolve(doc, pointer, aggregate)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        why = brief(str(e), 80) if isinstance(e, ValueError) else type(e).__name__
        raise ValueError(
            f"pointer {brief(pointer, 120)} does not resolve in this file ({why})"
        ) from None


def _resolve(doc: Any, pointer: str, aggregate: str | None) -> Any:
    found = [doc]
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        nxt = []
        for node in found:
            if part == "*":
                nxt += list(node.values() if isinstance(node, dict) else node)
            elif isinstance(node, list):
                nxt.append(node[int(part)])
            elif aggregate is None or (isinstance(node, dict) and part in node):
                nxt.append(node[part])  # aggregates skip items without the key
        found = nxt
    if aggregate is None:
        if len(found) != 1:
            raise ValueError(f"pointer {pointer} matches {len(found)} values; give an aggregate")
        return found[0]
    values = [float(v) for v in found if v is not None]
    return sum(values) / len(values) if values else None


def _same(a: Any, b: Any) -> bool:
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b)):
        return type(a) is type(b) and a == b
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def versions() -> dict[str, str | None]:
    """Versions of vitreg, python and the model libraries (optional ones: ``None`` if absent)."""
    import torch

    from vitreg.core.version import __version__

    def dist(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "vitreg_version": __version__,
        "torch_version": torch.__version__,
        "timm_version": dist("timm"),
        "transformers_version": dist("transformers"),
        "open_clip_version": dist("open_clip_torch"),
        "python_version": platform.python_version(),
    }


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def plain(obj: Any) -> Any:
    """JSON/YAML-ready copy: results models to their fields, tuples to lists, tensors/arrays to
    lists, paths to strings."""
    if isinstance(obj, BaseModel):
        return plain(obj.model_dump())
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return plain(obj.to_dict())
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return str(obj)


def _typed(described: ModelDescription | ModelInfo) -> ModelDescription | ModelInfo:
    """``described`` as given; a mapping (what ``describe()`` returned before it was typed) read
    as a :class:`ModelDescription` for one more release, with a ``DeprecationWarning``."""
    if isinstance(described, ModelDescription | ModelInfo):
        return described
    warnings.warn(
        "pass Model.describe() (a ModelDescription) rather than a mapping; mappings go in the "
        "next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return ModelDescription.model_validate(described)


def is_synthetic(model: ModelDescription | ModelInfo) -> bool:
    """Planted weights, a ``planted:`` spec or a note saying so: the report must say it in its
    first line (``model``: ``Model.describe()``, or a document's model block)."""
    model = _typed(model)
    return synthetic_weights(model.spec, model.weights, model.notes)


def synthetic_weights(spec: str | None, weights: str | None, notes: Sequence[str] | None) -> bool:
    """Whether a model with this spec, weight kind and notes is synthetic (:func:`is_synthetic`
    of its parts, as a typed model block holds them)."""
    said = " ".join(notes or []).lower()
    return weights == "planted" or (spec or "").startswith("planted:") or "synthetic" in said


def model_info(described: ModelDescription, **more: JsonValue) -> ModelInfo:
    """``Model.describe()`` regrouped as metrics.json's model block (dimensions together,
    synthetic flag); what it does not name (``supports_insertion``, fields of an older file,
    ``more``: a block such as a VLM's) kept after the named fields."""
    d = _typed(described)
    rest = {} if d.supports_insertion is None else {"supports_insertion": d.supports_insertion}
    rest |= {k: plain(v) for k, v in {**(d.model_extra or {}), **more}.items()}
    return ModelInfo(
        **{
            "spec": d.spec,
            "family": d.family,
            "source": d.source,
            "class_name": d.class_name,
            "synthetic": is_synthetic(d),
            "weights": d.weights,
            "layout": plain(d.layout),
            "dims": {k: getattr(d, k) for k in DIMS},
            "image_size": d.image_size,
            "attention": d.attention,
            "notes": list(d.notes),
            **rest,
        }
    )


def data_info(data: dict[str, JsonValue]) -> DataInfo:
    """The ``data`` block of metrics.json from an image source's description (JSON values):
    description, counts, skipped/converted files, the rest as is."""
    named = ("description", "n_images", "skipped", "converted")
    rest = {k: plain(v) for k, v in data.items() if k not in named}
    desc = data.get("description") or data.get("source") or data.get("images")
    return DataInfo(
        **rest,
        description=None if desc is None else str(desc),
        n_images=int(data.get("n_images", 0)),
        skipped={str(k): str(v) for k, v in (data.get("skipped") or {}).items()},
        converted={str(k): str(v) for k, v in (data.get("converted") or {}).items()},
    )
