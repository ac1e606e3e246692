"""The headline numbers of one experiment run: how each is read from a (variant, seed) record and
whether higher is better (shared by the variant runner and its comparison report)."""

from __future__ import annotations

from collections.abc import Callable

from vitreg.experiment.record import SeedRecord


def _score(run: SeedRecord, task: str, key: str) -> float | None:
    """A probe score's mean by ``feature/metric`` key; a leading ``*`` matches any prefix."""
    probes = run.probes.get(task)
    scores = probes.scores if probes is not None else {}
    match = (lambda k: k.endswith(key[1:])) if key.startswith("*") else key.__eq__
    return next((s.mean for k, s in scores.items() if match(k)), None)


def _block_mean(values: list[float | None] | None) -> float | None:
    vals = [v for v in values or [] if v is not None]
    return sum(vals) / len(vals) if vals else None


# headline key -> (how to read it from one run's record, higher is better)
SUMMARY: dict[str, tuple[Callable[[SeedRecord], float | None], bool | None]] = {
    "cls_top1": (lambda r: _score(r, "classification", "cls/top1"), True),
    "patch_mean_top1": (lambda r: _score(r, "classification", "patch_mean/top1"), True),
    "seg_miou": (lambda r: _score(r, "segmentation", "patches/miou"), True),
    "depth_rmse": (lambda r: _score(r, "depth", "*(regression)/rmse"), False),
    "artifacts_present": (lambda r: float(r.diagnose.artifacts_present), False),
    "outlier_rate": (lambda r: r.diagnose.outlier_rate, False),
    "cls_patch_pre_ln1": (lambda r: _block_mean(r.diagnose.cls_patch_pre_ln1), None),
    "cls_patch_post_ln1": (lambda r: _block_mean(r.diagnose.cls_patch_post_ln1), None),
    "params": (lambda r: r.params.total, None),
    "params_extra_pct": (lambda r: 100 * r.params.extra_total / r.params.baseline, None),
    "flops": (lambda r: r.flops.flops, False),
    "flops_delta_specialisation": (lambda r: r.flops.delta.specialisation, None),
    "final_loss": (lambda r: r.train.final_loss, None),
}
