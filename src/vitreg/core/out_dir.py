"""Run directories never clobber: ``--out`` is claimed before any model loads (see
:mod:`vitreg.core.run_dir`). The folder is locked for the whole run, must be new, empty or hold
only files vitreg wrote, and an earlier run in it is refused unless ``overwrite`` removes that
run's files (only those) first.

Verbs whose record says they resume (``train``, ``experiment``) continue their own run in place;
the others (``diagnose``, ``neurons``, ``fix``, ``probe``, ``compare``, ...) write a whole new
result, so a rerun into the same folder needs ``overwrite`` too. Files vitreg did not write are never removed.
"""

from __future__ import annotations

import os
from pathlib import Path

from vitreg.core.run_dir import claim
from vitreg.core.verb import VERBS


def check_out(out: Path, verb: str, model: str | None, overwrite: bool = False) -> None:
    """Claim ``out`` for a ``verb`` run of ``model`` before any model loads (locked until the
    verb's :class:`~vitreg.core.run_dir.session` ends). Raises :class:`InputError` when it is a
    file, cannot be written, is in use, holds files vitreg did not write or holds another run
    (``overwrite`` removes that run's files first; a verb that resumes continues its own run)."""
    is_file = Path(out).exists() and not Path(out).is_dir()
    if int(os.environ.get("RANK", "0")) != 0 and not is_file:
        return  # under torchrun rank 0 claims the folder (every rank refuses a file)
    claim(out, verb, model, overwrite, resume=VERBS[verb].resumes)
