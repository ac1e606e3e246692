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
from typing import Any

import torch

from vitreg.analysis.base import run_analyses
from vitreg.analysis.norms import NormAnalysis
from vitreg.core.renamed import renamed
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.fix.base import Fix, fix_description
from vitreg.fix.compare import DenseAnalysis, PooledAnalysis, cosine_stats
from vitreg.fix.methods import FIXES, NONE, FixInputs
from vitreg.models.model import Model, iter_batches
from vitreg.results.fix import Cosine
from vitreg.results.leaderboard import BoardEntry, BoardResults
from vitreg.results.probe import ProbeScore
from vitreg.results.schema import plain

# name -> fn(model, fix or None) -> {metric: its score over seeds}
Scorer = Callable[[Model, Fix | None], dict[str, ProbeScore]]


def board_entry(
    entry: str,
    *,
    part_of: list[str] | None = None,
    refused: str | None = None,
    measured: tuple[list[int], list[float]] = ([], []),
    fix: Fix | None = None,
    cosines: tuple[Cosine | None, Cosine | None] = (None, None),
    speed: tuple[float | None, float | None] = (None, None),
    scores: dict[str, ProbeScore] | None = None,
) -> BoardEntry:
    """One entry's row: ``measured`` its blocks with an outlier mode and max/median per block,
    ``cosines`` pooled and per patch to the unfixed model, ``speed`` images/s and relative
    to the unfixed model; the summary numbers computed from them once, here."""
    modes, ratios = measured
    return BoardEntry(
        entry=entry,
        fix=None if fix is None else plain(fix_description(fix)),
        part_of=part_of or [],
        refused=refused,
        blocks_with_mode=modes,
        clean=None if refused else not modes,
        max_over_median=ratios,
        residual_max_over_median=max(ratios) if ratios else None,
        last_block_max_over_median=ratios[-1] if ratios else None,
        pooled_cosine=cosines[0],
        patch_cosine=cosines[1],
        images_per_s=speed[0],
        relative_speed=speed[1],
        scores=scores or {},
    )


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
) -> BoardResults:
    """Run the unfixed model and every entry on ``data`` and measure each (see module doc);
    ``rounds`` timed bare/fixed rounds give each throughput ratio."""
    scorers = scorers or {}
    batches = [b.to(model.device) for b in iter_batches(data, batch_size, limit)]
    if not batches:
        raise InputError("no images to compare the fixes on")
    modes, ratios, base = _measure(model, batches, batch_size, None)
    speed, _ = throughput(model, batches, rounds=rounds)
    rows = [
        board_entry(
            NONE,
            measured=(modes, ratios),
            speed=(speed, 1.0),
            scores={m: v for s in scorers.values() for m, v in s(model, None).items()},
        )
    ]
    for entry, part_of in expand(entries).items():
        if progress is not None:
            progress(entry)
        measure = (batches, batch_size, base)
        rows.append(_bench_one(model, entry, part_of, inputs, measure, scorers, rounds))
    return BoardResults(n_images=sum(len(b) for b in batches), rows=rows)


def _bench_one(
    model: Model,
    entry: str,
    part_of: list[str],
    inputs: FixInputs,
    measure: tuple[list[torch.Tensor], int, dict[str, Any]],
    scorers: Mapping[str, Scorer],
    rounds: int,
) -> BoardEntry:
    """One entry measured on ``measure`` (the batches, the batch size and the unfixed run)
    against the unfixed run; refused with the reason when the model cannot take it."""
    batches, batch_size, base = measure
    try:
        fix = FIXES.build(entry, inputs)
        with fix.applied(model):
            modes, ratios, ran = _measure(model, batches, batch_size, None)
    except (UnsupportedModelError, InputError) as e:
        return board_entry(entry, part_of=part_of, refused=str(e))
    return board_entry(
        entry,
        part_of=part_of,
        measured=(modes, ratios),
        fix=fix,
        cosines=(
            cosine_stats(_pair(base, ran, "pooled")),
            cosine_stats(_pair(base, ran, "dense")),
        ),
        speed=throughput(model, batches, fix, rounds),
        scores={m: v for s in scorers.values() for m, v in s(model, fix).items()},
    )


def _pair(a: dict[str, Any], b: dict[str, Any], key: str) -> torch.Tensor | None:
    """Cosine between the two runs' ``key`` features (per image or per patch)."""
    if key not in a or key not in b:
        return None
    return torch.nn.functional.cosine_similarity(a[key], b[key], dim=-1).flatten()


__getattr__ = renamed(__name__, {"Board": "BoardResults", "BoardRow": "BoardEntry"}, globals())
