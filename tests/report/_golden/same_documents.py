"""Check that the code of this checkout writes the golden runs' documents again: each verb's
metrics.json (comparison.json, leaderboard.json) from a fresh run equals the golden one but for
the fields that record when, how long and where (``created``, wall times, throughputs, the
absolute path of a run compared), key order included.

Run by hand from the repository root, after a change that must keep behaviour:

    PYTHONPATH=src .venv/bin/python tests/report/_golden/same_documents.py

(about four minutes on two CPU cores; exit 1 naming the first difference of each document).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_runs import DOCUMENTS, RUNS, make_runs  # noqa: E402

#: fields that record when a run was made, by which release, or how long it took, not what it found
VOLATILE = {
    "created",
    "vitreg_version",
    "seconds",
    "time_s",
    "wall_s",
    "compute_s",
    "images_per_s",
    "relative_speed",
}


def volatile(key: str, value: Any) -> bool:
    """A field of when, how long or where on this machine (an absolute path)."""
    return key in VOLATILE or (key == "path" and isinstance(value, str) and value.startswith("/"))


def steady(value: Any) -> Any:
    """``value`` without its volatile fields, key order kept."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if not volatile(k, v)}
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


def first_difference(a: Any, b: Any, at: str = "") -> str | None:
    """The JSON path of the first place ``a`` and ``b`` differ (keys in order), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{at or '/'}: keys {list(a)} != {list(b)}"
        for k in a:
            found = first_difference(a[k], b[k], f"{at}/{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{at}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{at}/{i}")
            if found:
                return found
        return None
    return None if a == b and type(a) is type(b) else f"{at}: {a!r} != {b!r}"


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VITREG_PROGRESS", "off")
    import torch

    torch.manual_seed(0)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        before = os.getcwd()
        os.chdir(tmp)
        try:
            make_runs()
        finally:
            os.chdir(before)
        for name in RUNS:
            for doc in DOCUMENTS:
                golden = HERE / name / doc
                if not golden.is_file():
                    continue
                new = json.loads((Path(tmp) / name / doc).read_text())
                old = json.loads(golden.read_text())
                found = first_difference(steady(new), steady(old))
                print(f"{name}/{doc}: {'same' if found is None else 'DIFFERS at ' + found}")
                bad += found is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
