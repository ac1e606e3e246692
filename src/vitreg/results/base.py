"""The bases of every results model: unknown fields are errors, so the JSON Schema names every
field a run can hold; models whose fields depend on what wrote them (a task, a data set, a
NeuronSet file) keep a field left out out of the file too, and fields no model knows (a
user's own fix, task or data set) in a typed ``other`` block."""

from __future__ import annotations

import datetime as _dt
import json
import warnings
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from vitreg.core.renamed import renamed

Scalar = str | int | float | bool | None
#: a named setting as read: a plain value or a list of them (anything else as its JSON text)
Setting = Scalar | list[Scalar]


class ReadByKey(BaseModel):
    """A model that was a dict: ``m["x"]`` gives the field as written, for one release, with
    :attr:`key_read_warning` as its ``DeprecationWarning``."""

    key_read_warning: ClassVar[str]

    def __getitem__(self, key: str) -> JsonValue:
        warnings.warn(self.key_read_warning, DeprecationWarning, stacklevel=2)
        return self.model_dump(mode="json", by_alias=True)[key]  # type: ignore[no-any-return]


class ResultsModel(BaseModel):
    """A results model: every field declared (unknown ones rejected), NaN allowed (a statistic
    of nothing, e.g. the spread of one image)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=True)


class SparseResults(ResultsModel):
    """A results model whose optional fields depend on what wrote it (the task, the fix, the
    data set): a field the writer left out (None, not given) stays out of the file, and so
    does an empty ``other`` of an :class:`OpenResults` model."""

    @model_serializer(mode="wrap")
    def _sparse(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        given = self.model_fields_set
        out = {k: v for k, v in out.items() if v is not None or k in given}
        if out.get("other") == {}:
            del out["other"]
        return out


def as_setting(value: Any) -> Setting:
    """``value`` as a :data:`Setting`: plain values and lists of them as they are, anything
    else (a mapping, nested lists) as its JSON text."""
    plain = (str, int, float, bool, type(None))
    if isinstance(value, plain):
        return value  # type: ignore[no-any-return]
    if isinstance(value, list | tuple) and all(isinstance(v, plain) for v in value):
        return list(value)
    return json.dumps(value, sort_keys=True, default=str)


class OpenResults(SparseResults):
    """A :class:`SparseResults` model fed by code outside vitreg (a user's fix, task or data set, a
    NeuronSet file): fields it does not declare go into ``other`` instead of failing the run
    after its analysis."""

    other: dict[str, Setting] = Field(
        default_factory=dict,
        description="fields this model does not declare, as read (JSON text where not plain)",
    )

    @model_validator(mode="before")
    @classmethod
    def _collect(cls, data: Any) -> Any:
        """Undeclared fields moved into ``other``."""
        if not isinstance(data, dict):
            return data
        unknown = [k for k in data if k not in cls.model_fields]
        if not unknown:
            return data
        kept = {k: v for k, v in data.items() if k in cls.model_fields}
        other = dict(kept.get("other") or {})
        other.update({str(k): as_setting(data[k]) for k in unknown})
        return {**kept, "other": other}


class Stamp(ResultsModel):
    """What made a file: vitreg's, torch's, the model libraries' and python's versions, and
    when (shared by metrics.json and leaderboard.json)."""

    vitreg_version: str
    torch_version: str
    timm_version: str | None
    transformers_version: str | None = None
    open_clip_version: str | None = None
    python_version: str
    created: str

    @field_validator("created")
    @classmethod
    def _utc_iso(cls, v: str) -> str:
        if _dt.datetime.fromisoformat(v).utcoffset() != _dt.timedelta(0):
            raise ValueError("created must be an ISO timestamp in UTC")
        return v


__getattr__ = renamed(
    __name__,
    {"Strict": "ResultsModel", "Sparse": "SparseResults", "Open": "OpenResults"},
    globals(),
)
