"""Every fix side by side on one model and one set of images: per block, whether an outlier
mode is left and the max/median patch norm; the pooled and per-patch cosine to the unfixed
model; throughput relative to the unfixed model; and scores from caller-supplied probes.

A composed entry (``ttr+naclip``) brings its parts as rows of their own, so the table says
what each part did. A method the model cannot take is a row with the reason, not a crash.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from vitreg.analysis.base import run_analyses
from vitreg.analysis.norms import NormAnalysis
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.fix.base import Fix, fix_description
from vitreg.fix.compare import DenseAnalysis, PooledAnalysis, cosine_stats
from vitreg.fix.methods import FIXES, NONE, FixInputs
from vitreg.models.model import Model, iter_batches

# name -> fn(model, fix or None) -> {metric: {"mean": .., "ci95": .., "higher_is_better": ..}}
Scorer = Callable[[Model, Fix | None], dict[str, dict[str, Any]]]


@dataclass
class BoardRow:
    """One entry's measurements (``refused`` holds the reason when the model cannot take it)."""

    entry: str
    fix: dict[str, Any] | None = None  # as the fix describes itself; None: unfixed or refused
    part_of: list[str] = field(default_factory=list)
    refused: str | None = None
    blocks_with_mode: list[int] = field(default_factory=list)
    max_over_median: list[float] = field(default_factory=list)
    pooled_cosine: dict[str, Any] | None = None
    patch_cosine: dict[str, Any] | None = None
    images_per_s: float | None = None
    relative_speed: float | None = None
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        ratios = self.max_over_median
        return {
            "entry": self.entry,
            "fix": self.fix,
            "part_of": self.part_of,
            "refused": self.refused,
            "blocks_with_mode": self.blocks_with_mode,
            "clean": None if self.refused else not self.blocks_with_mode,
            "max_over_median": ratios,
            "residual_max_over_median": max(ratios) if ratios else None,
            "last_block_max_over_median": ratios[-1] if ratios else None,
            "pooled_cosine": self.pooled_cosine,
            "patch_cosine": self.patch_cosine,
            "images_per_s": self.images_per_s,
            "relative_speed": self.relative_speed,
            "scores": self.scores,
        }


@dataclass
class Board:
    """The leaderboard: the unfixed model first, then every entry (parts before compositions)."""

    rows: list[BoardRow]
    n_images: int

    def to_dict(self) -> dict[str, Any]:
        return {"n_images": self.n_images, "rows": [r.to_dict() for r in self.rows]}


def expand(entries: list[str]) -> dict[str, list[str]]:
    """Entry -> the compositions it is a part of; parts come before their composition."""
    out: dict[str, list[str]] = {}
    for entry in entries:
        parts = [m.name for m in FIXES.parts(entry)]
        if len(parts) > 1:
            for part in parts:
                out.setdefault(part, []).append(entry)
        out.setdefault(entry, [])
    return out


def _seconds(model: Model, batches: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    for b in batches:
        model.features(b)
    return time.perf_counter() - start


def throughput(
    model: Model, batches: list[torch.Tensor], fix: Fix | None = None, rounds: int = 3
) -> tuple[float, float]:
    """(images/s with ``fix``, its speed relative to the bare model): the two timed back to
    back in each of ``rounds`` rounds after a warm-up batch, the median of the round ratios
    (load from other processes hits both sides of a round alike)."""
    n = sum(len(b) for b in batches)
    ratios, best = [], float("inf")
    with torch.no_grad():
        model.features(batches[0])
        for _ in range(rounds):
            bare = _seconds(model, batches)
            with fix.applied(model) if fix is not None else contextlib.nullcontext():
                fixed = _seconds(model, batches)
            best = min(best, fixed)
            ratios.append(bare / max(fixed, 1e-9))
    return n / max(best, 1e-9), statistics.median(ratios)


def _measure(
    model: Model, data: Any, batch_size: int, limit: int | None
) -> tuple[list[int], list[float], dict[str, Any]]:
    ran, _, _ = run_analyses(
        model, data, [NormAnalysis(), PooledAnalysis(), DenseAnalysis()], batch_size, limit
    )
    layers = ran["norms"].summary.layers
    modes = [i for i, lo in enumerate(layers) if lo.artifacts_present]
    ratios = [lo.quantiles.max / max(lo.quantiles.p50, 1e-12) for lo in layers]
    return modes, ratios, ran


def bench_fixes(
    model: Model,
    entries: list[str],
    data: Any,
    inputs: FixInputs,
    *,
    batch_size: int = 32,
    limit: int | None = None,
    scorers: Mapping[str, Scorer] | None = None,
    progress: Callable[[str], None] | None = None,
    rounds: int = 3,
) -> Board:
    """Run the unfixed model and every entry on ``data`` and measure each (see module doc);
    ``rounds`` timed bare/fixed rounds give each throughput ratio."""
    scorers = scorers or {}
    batches = [b.to(model.device) for b in iter_batches(data, batch_size, limit)]
    if not batches:
        raise InputError("no images to compare the fixes on")
    modes, ratios, base = _measure(model, batches, batch_size, None)
    speed, _ = throughput(model, batches, rounds=rounds)
    rows = [
        BoardRow(
            NONE,
            None,
            blocks_with_mode=modes,
            max_over_median=ratios,
            images_per_s=speed,
            relative_speed=1.0,
            scores={m: v for s in scorers.values() for m, v in s(model, None).items()},
        )
    ]
    for entry, part_of in expand(entries).items():
        if progress is not None:
            progress(entry)
        row = BoardRow(entry, part_of=part_of)
        rows.append(row)
        try:
            fix = FIXES.build(entry, inputs)
            with fix.applied(model):
                row.blocks_with_mode, row.max_over_median, ran = _measure(
                    model, batches, batch_size, None
                )
        except (UnsupportedModelError, InputError) as e:
            row.refused = str(e)
            continue
        row.images_per_s, row.relative_speed = throughput(model, batches, fix, rounds)
        row.fix = fix_description(fix)
        row.pooled_cosine = cosine_stats(_pair(base, ran, "pooled"))
        row.patch_cosine = cosine_stats(_pair(base, ran, "dense"))
        row.scores = {m: v for s in scorers.values() for m, v in s(model, fix).items()}
    return Board(rows, sum(len(b) for b in batches))


def _pair(a: dict[str, Any], b: dict[str, Any], key: str) -> torch.Tensor | None:
    """Cosine between the two runs' ``key`` features (per image or per patch)."""
    if key not in a or key not in b:
        return None
    return torch.nn.functional.cosine_similarity(a[key], b[key], dim=-1).flatten()
