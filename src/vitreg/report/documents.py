"""Reading back the folders vitreg writes (:class:`RunDir`: a run's metrics.json, the
comparison.json of a ``diagnose --models`` or ``compare --out`` folder, the leaderboard.json of
``fix --method``). Each goes through the one JSON reader (size,
depth, UTF-8) and a type check of every field a reader indexes into, so that a forged or damaged
file is an :class:`InputError` naming the file and the field, never a KeyError or TypeError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from vitreg.core.containment import check_inside
from vitreg.core.readers import read_json
from vitreg.core.renamed import renamed
from vitreg.errors import InputError, brief
from vitreg.results.schema import RunDocument

if TYPE_CHECKING:
    from vitreg.results.comparison import Comparison, ModelComparison

MAX_RUN_FILE = 256 * 2**20  # bytes; a diagnose of a 40-block model writes a few MiB
NUMBER = (bool, int, float, type(None))
# the fields of one headline metric that readers use, and the types each may hold
METRIC_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "value": NUMBER,
    "higher_is_better": (bool, type(None)),
    "source": (str, type(None)),
    "aggregate": (str, type(None)),
    "layer": (int, type(None)),
}
# envelope fields and the types each may hold where present
ENVELOPE: dict[str, tuple[type, ...]] = {
    "verb": (str,),
    "command": (str,),
    "created": (str,),
    "model": (dict,),
    "data": (dict,),
    "config": (dict,),
    "results": (dict,),
}


def _what(value: Any) -> str:
    """``value`` named for an error: its type and its start."""
    if value is None:
        return "null"
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({brief(value, 40)})"


def check_metrics_document(doc: Any, path: Path) -> RunDocument:
    """``doc`` typed as a run's document if it has the shape of a metrics.json (an object with
    a ``metrics`` list of objects, each field of the type readers expect); an
    :class:`InputError` naming ``path`` and the first wrong field otherwise."""
    where = f"{path}"
    if not isinstance(doc, dict):
        raise InputError(f"{where} holds {_what(doc)}, not a result document (not a vitreg run)")
    for key, types in ENVELOPE.items():
        if key in doc and not isinstance(doc[key], types):
            raise InputError(f"{where}: {key} is {_what(doc[key])}, not a {types[0].__name__}")
    metrics = doc.get("metrics")
    if not isinstance(metrics, list):
        raise InputError(f"{where} has no metrics list (not a vitreg run)")
    for i, m in enumerate(metrics):
        if not isinstance(m, dict):
            raise InputError(f"{where}: metrics[{i}] is {_what(m)}, not an object")
        if not isinstance(m.get("name"), str):
            raise InputError(f"{where}: metrics[{i}].name is {_what(m.get('name'))}, not a string")
        for key, types in METRIC_FIELDS.items():
            if key in m and not isinstance(m[key], types):
                raise InputError(
                    f"{where}: metrics[{i}].{key} is {_what(m[key])}, not "
                    + " or ".join("null" if t is type(None) else t.__name__ for t in types)
                )
    return RunDocument.model_validate(doc)


# the document of each kind of folder, found in this order
DOCUMENTS = {
    "run": "metrics.json",
    "comparison": "comparison.json",
    "leaderboard": "leaderboard.json",
}
Kind = Literal["run", "comparison", "leaderboard"]


@dataclass(frozen=True)
class RunDir:
    """A folder vitreg wrote, by the document it holds: a verb's run (metrics.json), a
    comparison (comparison.json) or a fix leaderboard (leaderboard.json)."""

    path: Path
    kind: Kind
    document: Path

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """The folder at ``path`` (or the folder of a metrics.json passed itself); InputError
        naming what is missing when it holds no document vitreg writes."""
        path = Path(path)
        if path.is_file() or path.suffix == ".json":
            return cls(path.parent, "run", path)
        for kind, name in DOCUMENTS.items() if path.is_dir() else ():
            found = check_inside(
                path, path / name, name
            )  # one containment rule: inside the run folder
            if found.is_file():
                return cls(path, kind, found)  # type: ignore[arg-type]
        raise InputError(
            f"{path} holds no metrics.json (nor comparison.json, leaderboard.json); pass a "
            "folder written by vitreg"
        )

    def metrics(self) -> RunDocument:
        """The checked metrics.json of a run folder; InputError for a comparison or a
        leaderboard (their runs hold one each) and for a file that is not shaped like a run's."""
        if self.kind != "run":
            raise InputError(
                f"{self.path} holds a {self.kind} ({self.document.name}), not a run's metrics.json"
            )
        return read_metrics(self.document)


def read_leaderboard(folder: Path) -> Any:
    """The leaderboard.json of a ``fix --method`` folder as its typed document (a pydantic
    ValidationError says which field is wrong)."""
    from vitreg.results.leaderboard import BoardDocument

    path = check_inside(folder, folder / "leaderboard.json", "leaderboard.json")
    doc = read_json(path, "leaderboard file", max_bytes=MAX_RUN_FILE, allow_nan=True)
    return BoardDocument.model_validate(doc)


def metrics_file(run: Path) -> Path:
    """The metrics.json of ``run`` (a run directory, or the file itself); in a run directory it
    must resolve inside it (one containment rule)."""
    if not run.is_dir():
        return run
    return check_inside(run, run / "metrics.json", "metrics.json")


def read_metrics(run: Path) -> RunDocument:
    """The checked metrics.json of a run directory (or the file itself)."""
    path = metrics_file(Path(run))
    if not path.is_file():
        raise InputError(f"{run} has no metrics.json; pass run directories written by vitreg")
    doc = read_json(path, "run file", max_bytes=MAX_RUN_FILE, allow_nan=True)
    return check_metrics_document(doc, path)


def read_comparison(folder: Path) -> Comparison | ModelComparison:
    """The checked comparison.json of a ``diagnose --models`` or ``compare --out`` folder,
    typed: its verb, and the runs it lists (``runs``: per-model folders of diagnose, labels of
    compare)."""
    from pydantic import ValidationError

    from vitreg.results.comparison import COMPARISON

    path = check_inside(folder, folder / "comparison.json", "comparison.json")  # contained
    doc = read_json(path, "comparison file", max_bytes=MAX_RUN_FILE, allow_nan=True)
    if not isinstance(doc, dict):
        raise InputError(f"{path} holds {_what(doc)}, not a comparison")
    verb = doc.get("verb")
    if verb not in ("diagnose", "compare"):
        raise InputError(f"{path}: verb is {_what(verb)}, not diagnose or compare")
    for key in ("runs", "rows"):
        if not isinstance(doc.get(key), list):
            raise InputError(f"{path}: {key} is {_what(doc.get(key))}, not a list")
    for i, row in enumerate(doc["rows"]):
        if not isinstance(row, dict):
            raise InputError(f"{path}: rows[{i}] is {_what(row)}, not an object")
    if verb == "diagnose":
        for i, run in enumerate(doc["runs"]):
            name = run.get("run_dir") if isinstance(run, dict) else None
            if not isinstance(name, str) or not name or Path(name).name != name:
                raise InputError(
                    f"{path}: runs[{i}].run_dir is {_what(name)}, not the name of a folder "
                    "beside comparison.json"
                )
    else:
        sources = doc.get("sources")
        if not isinstance(sources, list) or not all(
            isinstance(s, dict) and isinstance(s.get("run"), str) for s in sources
        ):
            raise InputError(f"{path}: sources is not a list of objects with a run path")
    try:
        return COMPARISON.validate_python(doc)  # type: ignore[no-any-return]
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:])
        raise InputError(f"{path}: {where or 'the file'} {brief(first['msg'], 120)}") from None


def comparison_members(folder: Path, doc: Comparison | ModelComparison) -> list[Path]:
    """The run directories a comparison lists: the per-model folders of ``diagnose --models``,
    the runs ``compare`` read (where they were when it ran)."""
    if doc.verb == "diagnose":  # each folder resolves inside the comparison's
        return [check_inside(folder, folder / run.run_dir, "run_dir") for run in doc.runs]
    return [Path(s.path or s.run) for s in doc.sources]


__getattr__ = renamed(__name__, {"read_board": "read_leaderboard"}, globals())
