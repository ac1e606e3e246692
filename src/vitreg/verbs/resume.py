"""Checkpointed verbs: with ``checkpoint_every`` set, a verb's streaming passes save their state
into ``RUN.resume`` beside its run directory, a rerun of the same command resumes from there,
and the folder is removed once the run directory is written."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import JsonValue


def resume_folder(run_dir: Path) -> Path:
    """Where the checkpoints of ``run_dir`` go: ``RUN.resume`` beside it."""
    return run_dir.with_name(run_dir.name + ".resume")


@contextmanager
def checkpointed(run_dir: Path, every: int | None, config: dict[str, JsonValue]) -> Iterator[None]:
    """Inside, streaming passes checkpoint every ``every`` images (nothing when ``None``); the
    checkpoints belong to ``config`` (the resolved config as config.yaml holds it, ``to_file()``:
    another run's are refused)."""
    if every is None:
        yield
        return
    from vitreg.core.checkpoint import resumable

    identity = {k: v for k, v in config.items() if k not in ("overwrite",)}
    with resumable(resume_folder(run_dir), every, identity):
        yield


def finished(run_dir: Path, every: int | None) -> None:
    """Remove the checkpoints of a run whose directory is written (rank 0, after every rank)."""
    from vitreg import distributed

    if every is None:
        return
    distributed.barrier()
    if distributed.is_main():
        shutil.rmtree(resume_folder(run_dir), ignore_errors=True)
