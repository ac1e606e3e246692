"""The text pieces that a run's report and the console summary share, so that both say a number
or a verdict the same way (the CLI prints through these; it reads no report module itself).
Each is imported from its report module when first used, so that ``vitreg --help`` stays light."""

from __future__ import annotations

import importlib
from typing import Any

#: each shared piece -> (its module, its name there)
PIECES = {
    "num": ("vitreg.report.render.markdown", "num"),
    "pct": ("vitreg.report.render.markdown", "pct"),
    "board_table": ("vitreg.report.renderers.leaderboard", "board_table"),
    "blocks_text": ("vitreg.report.renderers.neurons", "blocks_text"),
}


def __getattr__(name: str) -> Any:
    if name not in PIECES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = PIECES[name]
    return getattr(importlib.import_module(module), attr)


__all__ = sorted(PIECES)
