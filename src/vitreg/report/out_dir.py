"""Run directories never clobber: ``--out`` is checked before any model loads (a folder vitreg
can write), and a folder that holds another run -- another command's, another model's, or this
command's earlier results -- is refused unless ``overwrite`` removes that run's files first.

Verbs that resume (``train``, ``experiment``) continue their own run in place; the other verbs
(``diagnose``, ``neurons``, ``fix``, ``probe``, ``compare``) write a whole new result, so a rerun
into the same folder needs ``overwrite`` too. Files vitreg did not write are never removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitreg.core.readers import read_json, read_yaml
from vitreg.errors import InputError

# what any verb writes into its run directory (a comparison's per-model folders are found from
# its comparison.json)
RUN_FILES = (
    "metrics.json",
    "config.yaml",
    "report.md",
    "report.html",
    "figures",
    "neurons.json",
    "neurons.safetensors",
    "comparison.md",
    "comparison.json",
    "compare.md",
    "compare.json",
    "log.jsonl",
    "train.json",
    "model.safetensors",
    "checkpoints",
    "experiment.json",
    "variants",
)
RESUMABLE = ("train", "experiment")  # verbs that continue their own run in place


@dataclass(frozen=True)
class RunIdentity:
    """What wrote a run directory: the verb and the model (spec, variant or comma-joined specs)."""

    verb: str
    model: str | None

    def same_as(self, other: RunIdentity) -> bool:
        """The same verb on the same model (a run that records no model matches any)."""
        return self.verb == other.verb and self.model in (None, other.model)

    def describe(self) -> str:
        return f"a `vitreg {self.verb}` run" + (f" of {self.model}" if self.model else "")


def _json(path: Path) -> Any:
    """The JSON in ``path`` (read with the one reader's budgets), None when absent or not JSON."""
    if not path.is_file():
        return None
    try:
        return read_json(path, "run file", max_bytes=2**30, allow_nan=True)
    except InputError:
        return None


def _yaml(path: Path) -> Any:
    """The YAML in ``path`` (read with the one reader's budgets), None when absent or not YAML."""
    if not path.is_file():
        return None
    try:
        return read_yaml(path, "config")
    except InputError:
        return None


def identify(folder: Path) -> RunIdentity | None:
    """The run ``folder`` holds, from its metrics.json, config.yaml or the files only one verb
    writes; ``None`` when it holds none."""
    metrics = _json(folder / "metrics.json")
    if isinstance(metrics, dict) and isinstance(metrics.get("verb"), str):
        model = metrics.get("model")
        spec = model.get("spec") if isinstance(model, dict) else None
        return RunIdentity(metrics["verb"], spec if isinstance(spec, str) else None)
    comparison = _json(folder / "comparison.json")
    if isinstance(comparison, dict):
        if comparison.get("verb") == "compare":
            return RunIdentity("compare", None)
        return RunIdentity("diagnose", _models(comparison))
    config = _yaml(folder / "config.yaml")
    if isinstance(config, dict) and isinstance(config.get("verb"), str):
        model = config.get("spec") or config.get("variant") or config.get("models")
        return RunIdentity(config["verb"], model if isinstance(model, str) else None)
    for name, verb in (
        ("train.json", "train"),
        ("log.jsonl", "train"),
        ("checkpoints", "train"),
        ("experiment.json", "experiment"),
        ("neurons.json", "neurons"),
        ("compare.json", "compare"),
    ):
        if (folder / name).exists():
            return RunIdentity(verb, None)
    return None


def _models(comparison: dict[str, Any]) -> str | None:
    runs = comparison.get("runs")
    if not isinstance(runs, list):
        return None
    return ",".join(str(r.get("model")) for r in runs if isinstance(r, dict))


def remove_run(folder: Path) -> list[str]:
    """Delete the run files of ``folder`` (and the per-model folders its comparison lists);
    links are unlinked, never followed. The names removed."""
    removed = []
    comparison = _json(folder / "comparison.json")
    subdirs = []
    if isinstance(comparison, dict) and isinstance(comparison.get("runs"), list):
        for r in comparison["runs"]:
            name = r.get("run_dir") if isinstance(r, dict) else None
            if isinstance(name, str) and name and Path(name).name == name:  # no ../ or abs
                subdirs.append(name)
    for name in (*RUN_FILES, *subdirs):
        path = folder / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            continue
        removed.append(name)
    return removed


def _writable(out: Path) -> None:
    """Write a file in ``out`` (as root, permission bits alone say nothing); folders made for
    the check are removed again, so a run that fails later leaves nothing behind."""
    made = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".vitreg-write-check-"):
            pass
    except OSError as e:
        raise InputError(
            f"--out {str(out)!r} cannot be written ({e.strerror or e}); pass a folder you can "
            "write to"
        ) from None
    finally:
        for folder in made:  # innermost first
            if folder.is_dir():
                folder.rmdir()


def check_out(out: Path, verb: str, model: str | None, overwrite: bool = False) -> None:
    """Make ``out`` ready for a ``verb`` run of ``model`` before any model loads: a writable
    folder holding no other run (``overwrite`` removes an existing run's files first; ``train``
    and ``experiment`` continue their own run). Raises :class:`InputError` otherwise."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(
            f"--out {str(out)!r} is a file, not a folder; pass a folder (it is created if missing)"
        )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun rank 0 prepares the folder
        return
    found = identify(out) if out.is_dir() else None
    if found is not None:
        mine = RunIdentity(verb, model)
        if found.same_as(mine) and verb in RESUMABLE and not overwrite:
            return  # the verb resumes its own run (and checks that it matches)
        if not overwrite:
            what = (
                "the results of this same command on this model; a rerun would replace them"
                if found.same_as(mine)
                else f"{found.describe()}, not {mine.describe()}"
            )
            raise InputError(
                f"--out {str(out)!r} already holds {what}; pass another --out, or --overwrite "
                "to remove that run's files first"
            )
        remove_run(out)
    _writable(out)
