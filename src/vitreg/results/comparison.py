"""comparison.json: what ``vitreg compare`` (one row per headline metric, one value per run)
and ``vitreg diagnose --models`` (one row per model) write, and read back to render again.

Files written before a comparison kept its provenance lack the versions, ``created``,
``command`` and ``config``; a field a file leaves out stays out when it is written again.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import ConfigDict, Field, JsonValue, PrivateAttr, TypeAdapter

from vitreg.results.base import SparseResults
from vitreg.results.schema import Number, RunDocument

#: which way a metric is better, in words (the long format's ``direction``)
DIRECTION = {True: "higher is better", False: "lower is better", None: ""}


class ComparisonFile(SparseResults):
    """What made a comparison: the verb, the versions, time (UTC), command line and settings."""

    model_config = ConfigDict(extra="ignore")  # a reader uses only the fields it names

    verb: str
    vitreg_version: str | None = None
    torch_version: str | None = None
    timm_version: str | None = None
    transformers_version: str | None = None
    open_clip_version: str | None = None
    python_version: str | None = None
    created: str | None = None
    command: str | None = None
    config: dict[str, JsonValue] | None = None

    @property
    def has_provenance(self) -> bool:
        """Whether the file keeps what made it (files written before it did keep none)."""
        return self.created is not None and self.command is not None


class RunSource(SparseResults):
    """One compared run: the path given, where it was, its verb, command and model spec."""

    model_config = ConfigDict(extra="ignore")

    run: str
    path: str | None = None
    verb: str | None = None
    command: str | None = None
    model: JsonValue = None


class ComparisonRow(SparseResults):
    """One headline metric across the runs: its value in each (None where absent), its 95%
    half-width where the run keeps one, and each run's verdict against the first."""

    model_config = ConfigDict(extra="ignore")

    metric: str
    verb: str
    higher_is_better: bool | None
    values: list[Number]
    ci95: list[float | None] | None = None
    vs_first: list[str | None] | None = None


class LongRow(SparseResults):
    """The long format of a comparison: one run's value of one metric, and which way is
    better in words."""

    run: str
    metric: str
    value: Number
    direction: str


class Comparison(ComparisonFile):
    """``vitreg compare``: the run labels, where each run was, one row per headline metric,
    the paths skipped (not runs) and why, and notes on runs that do not follow the schema;
    ``documents`` are the runs' documents as read (not written to comparison.json)."""

    verb: Literal["compare"] = "compare"
    runs: list[str]
    sources: list[RunSource]
    rows: list[ComparisonRow]
    skipped: dict[str, str] = Field(default_factory=dict)
    notes: list[str] | None = None
    _documents: list[RunDocument] = PrivateAttr(default_factory=list)

    @property
    def documents(self) -> list[RunDocument]:
        """The compared runs' documents as read, in the order of ``runs``."""
        return self._documents

    def with_documents(self, documents: list[RunDocument]) -> Comparison:
        """This comparison, holding the runs' ``documents``."""
        self._documents = list(documents)
        return self

    def long_rows(self) -> list[LongRow]:
        """One row per (run, metric) that has a value, runs in order."""
        return [
            LongRow(
                run=run,
                metric=row.metric,
                value=row.values[i],
                direction=DIRECTION[row.higher_is_better],
            )
            for i, run in enumerate(self.runs)
            for row in self.rows
            if row.values[i] is not None
        ]


class ModelRun(SparseResults):
    """One model of ``diagnose --models``: its spec and its run folder beside comparison.json."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    run_dir: str


class ModelComparison(ComparisonFile):
    """``vitreg diagnose --models``: each model's run folder and one row of headline numbers
    per model (the columns of the diagnose renderer's cross-model table)."""

    verb: Literal["diagnose"] = "diagnose"
    runs: list[ModelRun]
    rows: list[dict[str, Number | str]]


AnyComparison = Annotated[Union[Comparison, ModelComparison], Field(discriminator="verb")]  # noqa: UP007
COMPARISON = TypeAdapter(AnyComparison)
