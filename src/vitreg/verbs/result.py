"""What a verb returns: its run directory, the result document it wrote, the notices a user
should see (as data: the caller decides how to show them) and the objects its summary reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pydantic import JsonValue

    from vitreg.results.comparison import Comparison, LongRow
    from vitreg.results.probe import ProbeResults
    from vitreg.results.vlm import VlmResults

NoticeKind = Literal[
    "demo",  # no model given: the synthetic demo runs
    "random_init",  # the model has random, untrained weights
    "model",  # a loader's note about the model
    "images",  # which images, from where
    "split",  # the discovery / held-out split
    "discovery",  # neurons are discovered first, on these images
    "warning",  # something the user should check (e.g. a NeuronSet made for other weights)
    "resumed",  # training continued from a checkpoint
    "log",  # a step of a long run (the experiment grid: which variant, which phase)
    "generation",  # how a VLM's answers are generated (greedy, the tokens it never emits)
]


@dataclass(frozen=True)
class Notice:
    """One message for the user, in the order the run produced it; ``caution`` marks a
    synthetic or doubtful input (the CLI shows those in yellow)."""

    kind: NoticeKind
    text: str
    caution: bool = False


Listener = Callable[[Notice], None]


class Notices:
    """A run's notices in order, each also passed to ``listener`` when it happens (the CLI
    prints them as the run goes; a Python caller may leave it out and read the result's)."""

    def __init__(self, listener: Listener | None = None) -> None:
        self.items: list[Notice] = []
        self._listener = listener

    def append(self, notice: Notice) -> None:
        """Record ``notice`` and tell the listener."""
        self.items.append(notice)
        if self._listener is not None:
            self._listener(notice)


@dataclass
class VerbResult:
    """A finished run: ``document`` is its metrics.json (``None`` on a torchrun rank that does
    not write); ``notices`` what the run reported along the way."""

    verb: str
    run_dir: Path
    document: dict[str, Any] | None
    notices: list[Notice] = field(default_factory=list)


@dataclass
class DiagnoseRun(VerbResult):
    """``labelled``: (spec, DiagnoseResult) per model; ``run_dirs`` one per model; with several
    models ``comparison`` is the comparison report and ``document`` its comparison.json."""

    labelled: list[tuple[str, Any]] = field(default_factory=list)
    run_dirs: list[Path] = field(default_factory=list)
    comparison: Path | None = None


@dataclass
class NeuronsRun(VerbResult):
    """``found``: the automatic path's :class:`~vitreg.neurons.auto.NeuronSearchResult`;
    ``spec`` the model."""

    found: Any = None
    spec: str = ""


@dataclass
class FixRun(VerbResult):
    """``comparison``: the before/after :class:`~vitreg.fix.compare.FixComparison`; ``fix`` the
    TestTimeRegisters applied; ``saved`` where the fixed model was saved, if asked."""

    comparison: Any = None
    fix: Any = None
    saved: Path | None = None


@dataclass
class ProbeRun(VerbResult):
    """``probe``: the typed probe results (conditions, deltas, yardsticks), as metrics.json holds
    them; ``verdict`` the run in one sentence, as its report says it."""

    probe: ProbeResults | None = None
    verdict: str = ""


@dataclass
class TrainRun(VerbResult):
    """``training``: :func:`vitreg.train.train`'s result (steps, history, resumed_from)."""

    training: Any = None


@dataclass
class ExperimentRun(VerbResult):
    """``experiment``: the variant grid's result; ``seconds`` the wall time of the run."""

    experiment: Any = None
    seconds: float = 0.0


@dataclass
class VlmRun(VerbResult):
    """``results``: answers, attention and norms per image, and their summary (the typed
    results block of its metrics.json)."""

    results: VlmResults | None = None


@dataclass
class BoardRun:
    """``vitreg fix --method``: the leaderboard's folder, the board itself, the run's notices and
    the leaderboard.json document written (typed: ``leaderboard.board.rows``)."""

    run_dir: Path
    board: Any
    notices: list[Notice]
    leaderboard: Any = None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the run of ``spec``: no metrics.json was written for it, unless the
    analysis had finished and ``saved`` is its metrics.json (then only the report is missing)."""

    def __init__(self, spec: str, saved: Path | None = None) -> None:
        super().__init__(spec)
        self.spec, self.saved = spec, saved

    def what_is_kept(self) -> str:
        """In words: what the interrupted run left, and how to render its report."""
        if self.saved is None:
            return f"no metrics.json was written for {self.spec}"
        from vitreg.report.writer import again_command

        return (
            f"the results of {self.spec} are saved in {self.saved}; "
            f"`{again_command(self.saved.parent)}` renders its report"
        )


@dataclass
class CompareRun:
    """``vitreg compare``: the merged table (typed: ``merged.rows``, ``merged.skipped``, ...),
    its long form (one row per run and metric) and the folder written with ``--out``."""

    merged: Comparison
    rows: list[LongRow]
    out: Path | None


@dataclass
class Checked:
    """One folder ``vitreg validate`` checked: valid or not, and what it holds or what is wrong."""

    path: Path
    valid: bool
    text: str


@dataclass
class ValidateRun:
    """``vitreg validate``: each folder's verdict, in the order given."""

    checked: list[Checked]

    @property
    def invalid(self) -> int:
        """How many folders failed."""
        return sum(not c.valid for c in self.checked)


@dataclass
class ReportRun:
    """``vitreg report``: the files rendered again."""

    written: list[Path]


@dataclass
class SchemaRun:
    """``vitreg schema``: the JSON Schema's text, and the file it was written to (if asked)."""

    text: str
    out: Path | None


@dataclass
class InspectRun:
    """``vitreg inspect``: ``Model.describe()`` with the layout and (if asked) hook names, and
    the :class:`~vitreg.core.layout.TokenLayout` at the size asked."""

    info: dict[str, JsonValue]
    layout: Any


@dataclass
class ModelsRun:
    """``vitreg models``: one row per supported family (key, name, examples, notes, status)."""

    rows: list[dict[str, Any]]


@dataclass
class PushRun:
    """``vitreg push``: the folder uploaded, the repository and the commit's URL."""

    directory: Path
    repo: str
    url: str
