"""The base of every results model: unknown fields are errors, so the JSON Schema names every
field a run can hold."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A results model: every field declared (unknown ones rejected), NaN allowed (a statistic
    of nothing, e.g. the spread of one image)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=True)
