"""What a comparison says about a run it compares but cannot fully trust: a document that does
not follow the schema (compared by its headline numbers only) and a headline that is not a
number (NaN or infinite: left out, never printed as ``nan``)."""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import ValidationError

from vitreg.errors import brief


def not_finite(value: object) -> bool:
    """Whether a headline value is a float that is NaN or infinite."""
    return isinstance(value, float) and not math.isfinite(value)


def schema_notes(run: Path, error: ValueError) -> list[str]:
    """The note of a compared run whose document the schema refused with ``error`` (its first
    problem other than a value that is not a number, which has its own note); none if that
    was the only problem."""
    if isinstance(error, ValidationError):
        errors = [err for err in error.errors() if "finite" not in str(err.get("msg"))]
        if not errors:
            return []
        where = ".".join(str(part) for part in errors[0]["loc"][1:]) or "the document"
        why = f"{where[:80]}: {str(errors[0]['msg'])[:120]}"
    else:
        why = brief(str(error), 200)
    return [
        f"{run}: its metrics.json does not follow the result schema ({why}); it is compared by "
        "its headline numbers only and drawn as no curve"
    ]


def value_note(run: Path, name: str, value: float) -> str:
    """The note of a headline that is NaN or infinite: left out of the comparison."""
    return (
        f"{run}: the headline {brief(name, 80)} is {value} in its metrics.json, not a number; "
        "it is left out of the comparison"
    )
