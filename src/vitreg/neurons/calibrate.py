"""Choose top-k for test-time registers: the smallest k whose fix brings the outlier rate on
held-out images below a target -- at one or several input resolutions (a set chosen at one
resolution is known to fail at another)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from vitreg.errors import VitregError
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, iter_batches
from vitreg.neurons.discover import outlier_mask
from vitreg.neurons.neuron_set import NeuronSet

DEFAULT_KS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)


@dataclass
class TopKCurve:
    """Outlier rate and patch-norm statistics at the detection layer for each k and resolution."""

    target: float
    detect_layer: int
    ks: list[int]
    outlier_rate: dict[int, list[float]]  # resolution -> rate per k
    max_norm: dict[int, list[float]]
    median_norm: dict[int, list[float]]
    chosen_k: int | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _resize(batch: torch.Tensor, size: int | None) -> torch.Tensor:
    if size is None or batch.shape[-1] == size and batch.shape[-2] == size:
        return batch
    return F.interpolate(batch, size=(size, size), mode="bicubic", align_corners=False)


def fixed_outlier_stats(
    model: Model,
    neurons: NeuronSet,
    data: Any,
    detect_layer: int,
    rule: str,
    value: float | None,
    size: int | None = None,
    batch_size: int = 32,
    limit: int | None = None,
    **ttr_options: Any,
) -> tuple[float, float, float]:
    """(patch outlier rate, max patch norm, median patch norm) at ``detect_layer`` with the fix."""
    rates, maxima, medians, counted = [], [], [], [0]
    site = f"blocks.{detect_layer}.hook_resid_post"

    def record(t: torch.Tensor, hook: HookContext) -> None:
        norms = t.detach().float().norm(dim=-1)
        patches = hook.layout.take(norms, "patches")
        rates.append(outlier_mask(norms, rule, value)[:, hook.layout.patches].float().sum())
        counted[0] += patches.numel()
        maxima.append(patches.max())
        medians.append(patches.median())

    ttr = TestTimeRegisters(neurons, **ttr_options)
    with torch.no_grad(), ttr.applied(model), model.hooks([(site, record)]):
        for batch in iter_batches(data, batch_size, limit):
            model.features(_resize(batch, size))
    if not counted[0]:
        raise VitregError("calibration got no images")
    return (
        float(sum(rates) / counted[0]),
        float(torch.stack(maxima).max()),
        float(torch.stack(medians).median()),
    )


def calibrate_top_k(
    model: Model,
    neurons: NeuronSet,
    data: Any,
    *,
    target: float = 0.01,
    ks: Sequence[int] | None = None,
    image_sizes: Sequence[int | None] = (None,),
    batch_size: int = 32,
    limit: int | None = None,
    progress: Callable[[int], None] | None = None,
    **ttr_options: Any,
) -> tuple[NeuronSet, TopKCurve]:
    """The smallest k (over the ranked ``neurons``) meeting ``target`` at every resolution.

    ``data`` should be held-out images (not those used for discovery). The curve stops at the
    first k that meets the target everywhere; if none does, every k is tried and the largest is
    returned with a note.
    """
    s = neurons.settings
    detect = s.get("detect_layer")
    rule = s.get("threshold", "auto")
    value = s.get("threshold_value")
    if detect is None:
        raise VitregError("this NeuronSet records no detection layer; rediscover or pass one")
    candidates = sorted({k for k in (ks or DEFAULT_KS) if 0 <= k <= len(neurons)} | {len(neurons)})
    sizes = [None if z is None else int(z) for z in image_sizes]
    curve = TopKCurve(target, detect, [], {}, {}, {}, None)
    for z in sizes:
        key = z or 0
        curve.outlier_rate[key], curve.max_norm[key], curve.median_norm[key] = [], [], []
    for i, k in enumerate(candidates):
        ok = True
        for z in sizes:
            rate, mx, med = fixed_outlier_stats(
                model,
                neurons.top(k),
                data,
                detect,
                rule,
                value,
                z,
                batch_size,
                limit,
                **ttr_options,
            )
            key = z or 0
            curve.outlier_rate[key].append(rate)
            curve.max_norm[key].append(mx)
            curve.median_norm[key].append(med)
            ok = ok and rate <= target
        curve.ks.append(k)
        if progress is not None:
            progress(i + 1)
        if ok:
            curve.chosen_k = k
            break
    if curve.chosen_k is None:
        curve.notes.append(
            f"no k up to {len(neurons)} brings the outlier rate below {target}; using all "
            "neurons. Discover more neurons (larger top_k) or search more layers"
        )
    k = curve.chosen_k if curve.chosen_k is not None else len(neurons)
    chosen = neurons.top(k)
    chosen.settings = {**chosen.settings, "calibration": curve.to_dict()}
    return chosen, curve
