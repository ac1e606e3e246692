"""Causal selection of register neurons: keep the units that *create* the outliers.

Algorithm 1 of Jiang et al. ranks units by their activation on outlier tokens, which ranks units
that *read* an existing outlier (and fire because of it) as high as the units that write it. Here
each candidate is judged by what zeroing it does to the outliers at the detection layer, on
held-out images:

- **excess**: for the base run's outlier patches ``O``, the mean over ``O`` of
  ``max(0, log(norm / m))`` (``m``: the base median patch norm), minus the same mean over the
  ordinary patches -- 0 when the outlier patches look like ordinary ones;
- **greedy forward selection**: at each step, one forward and backward pass with the current set
  zeroed measures the excess exactly and estimates, through a gate on every candidate unit, how
  much zeroing each remaining one would remove (``activation x gradient``); the best ones are
  added. Weak units that only matter together are found because each removes part of the excess;
  a unit that fires only because of an outlier stops firing once it is gone, so it adds nothing;
- **pruning**: each chosen unit is measured exactly, zeroed alone (the others active) and restored
  alone (the others zeroed); a unit that moves the excess neither way is dropped. Units that read
  an outlier that already exists sit after the emergence layer, outside the searched range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vitreg.analysis.rules import image_mask
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, iter_batches

Unit = tuple[int, int]


@dataclass
class Baseline:
    """The base run on the causal images: outlier patches, the median and the ordinary excess."""

    threshold: float | None
    median: float
    ordinary_excess: float
    outlier_excess: float
    n_outliers: int
    masks: list[torch.Tensor]  # per batch, [B, N] bool outlier patches


@dataclass
class CausalSelection:
    """The chosen units in selection order, each with its measured effect, and the path there."""

    detect_layer: int
    chosen: list[Unit]
    baseline: dict[str, float]
    residual: float  # excess left with the chosen set zeroed, as a fraction of the base excess
    effects: dict[Unit, dict[str, float]]  # alone / in_set (exact), estimated (first step)
    steps: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    candidates: int = 0
    n_images: int = 0
    passes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "greedy forward selection on the outlier excess at the detection layer "
            "(gradient-estimated marginals, exact passes), then drop-one pruning",
            "detect_layer": self.detect_layer,
            "n_candidates": self.candidates,
            "n_images": self.n_images,
            "passes": self.passes,
            "baseline": self.baseline,
            "residual_fraction": self.residual,
            "chosen": [list(u) for u in self.chosen],
            "effects": [{"layer": u[0], "unit": u[1], **self.effects[u]} for u in self.chosen],
            "steps": self.steps,
            "dropped": self.dropped,
        }


class CausalProbe:
    """Exact excess (and gate gradients) of the model with a set of units zeroed."""

    def __init__(
        self,
        model: Model,
        images: torch.Tensor,
        detect_layer: int,
        rule: str,
        value: float | None,
        candidates: Sequence[Unit],
        batch_size: int = 16,
    ) -> None:
        self.model = model
        self.images = images
        self.detect = detect_layer
        self.batch_size = batch_size
        self.layers = sorted({layer for layer, _ in candidates})
        self.passes = 0
        self.base = self._baseline(rule, value)

    # one pass ---------------------------------------------------------------------------------
    def _run(
        self, zeroed: Sequence[Unit], grad: bool, batch_fn: Callable[[int, torch.Tensor], Any]
    ) -> dict[int, torch.Tensor] | None:
        """Forward every batch up to the detection layer with ``zeroed`` units gated to 0.

        ``batch_fn(i, norms)`` turns batch ``i``'s ``[B, N]`` norms into a scalar to add up (its
        gradient flows to the gates when ``grad``). Returns the gate gradients when ``grad``.
        """
        model = self.model
        gates = {}
        for layer in self.layers:
            g = torch.ones(model.d_mlp, device=model.device, dtype=model.dtype)
            off = [u for lay, u in zeroed if lay == layer]  # zeroed units are candidates
            if off:
                g[off] = 0
            gates[layer] = g.requires_grad_(grad)
        grads = {layer: torch.zeros(model.d_mlp, dtype=torch.float64) for layer in self.layers}
        state: dict[str, Any] = {}

        def gate(layer: int):
            def fn(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
                return t * gates[layer]

            return fn

        def detach(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
            return t.detach()  # branch inputs: gradients take only the direct (residual) path

        def reach(t: torch.Tensor, hook: HookContext) -> None:
            state["value"] = batch_fn(state["batch"], t.float().norm(dim=-1))

        hooks = [(hook_name(lay, "mlp.hook_post"), gate(lay)) for lay in self.layers]
        if grad:
            for i in range(self.layers[0] + 1, self.detect + 1):
                hooks += [(hook_name(i, f"{ln}.hook_out"), detach) for ln in ("ln1", "ln2")]
        hooks.append((hook_name(self.detect, "hook_resid_post"), reach))
        with model.hooks(hooks), torch.set_grad_enabled(grad):
            for i, batch in enumerate(iter_batches(self.images, self.batch_size)):
                state["batch"] = i
                # later blocks cannot change the detection layer's output: stop after it
                model.features(batch, stop_at_layer=self.detect + 1)
                if grad:
                    used = [gates[lay] for lay in self.layers]
                    got = torch.autograd.grad(state["value"], used, allow_unused=True)
                    for lay, g in zip(self.layers, got, strict=True):
                        if g is not None:
                            grads[lay] += g.detach().double().cpu()
        self.passes += 1
        return grads if grad else None

    def _baseline(self, rule: str, value: float | None) -> Baseline:
        norms: list[torch.Tensor] = []
        self._run([], False, lambda i, n: norms.append(n.detach().cpu()))
        lay = self.model.layout
        patches = [lay.take(n, "patches") for n in norms]
        flat = torch.cat([p.flatten() for p in patches])
        median = float(flat.median())
        masks = []
        for n in norms:
            m = image_mask(n, rule, value)
            m[:, lay.prefix] = False  # patches only
            masks.append(m)
        logs = (flat / median).log().clamp_min(0)
        outlier = torch.cat([m[:, lay.patches].flatten() for m in masks])
        n_out = int(outlier.sum())
        ordinary = float(logs[~outlier].mean()) if (~outlier).any() else 0.0
        above = float(logs[outlier].mean()) if n_out else 0.0
        return Baseline(value, median, ordinary, above, n_out, masks)

    # the excess ------------------------------------------------------------------------------
    def excess(self, zeroed: Sequence[Unit], grad: bool = False) -> tuple[float, dict | None]:
        """Mean log-excess of the base outlier patches over the ordinary level with ``zeroed`` off,
        and (``grad``) its gradient wrt every candidate unit's gate."""
        b = self.base
        total: list[torch.Tensor] = []

        def batch_fn(i: int, norms: torch.Tensor) -> torch.Tensor:
            m = b.masks[i].to(norms.device)
            s = (norms[m] / b.median).log().clamp_min(0).sum() / max(b.n_outliers, 1)
            total.append(s.detach())
            return s

        grads = self._run(zeroed, grad, batch_fn)
        value = float(sum(total)) - b.ordinary_excess if total else 0.0
        return value, grads


def select_causal(
    model: Model,
    images: torch.Tensor,
    candidates: Sequence[Unit],
    detect_layer: int,
    rule: str,
    value: float | None,
    *,
    min_gain: float = 0.01,
    clean_at: float = 0.02,
    max_units: int = 64,
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
) -> CausalSelection:
    """Greedy causal selection among ``candidates`` (ranked ``(layer, unit)`` pairs).

    Each step adds the remaining candidates whose estimated removal is at least half the best
    one's and at least ``min_gain`` of the base excess. It stops when the excess left is below
    ``clean_at`` of the base (the outlier patches look ordinary), when no candidate would remove
    ``min_gain`` more, or at ``max_units``. Estimates come from the direct (residual-stream) path
    of each unit's write, so a unit that only feeds other units (a feature detector upstream of
    the writers) is not taken for a writer; every measured excess is exact.
    """
    probe = CausalProbe(model, images, detect_layer, rule, value, candidates, batch_size)
    base_excess, grads = probe.excess([], grad=True)
    selection = CausalSelection(
        detect_layer,
        [],
        {
            "threshold": rule,
            "threshold_value": value,
            "median_patch_norm": probe.base.median,
            "n_outlier_patches": probe.base.n_outliers,
            "outlier_excess": probe.base.outlier_excess,
            "ordinary_excess": probe.base.ordinary_excess,
            "excess": base_excess,
        },
        1.0,
        {},
        candidates=len(candidates),
        n_images=int(images.shape[0]),
    )
    if probe.base.n_outliers == 0 or base_excess <= 0:
        selection.passes = probe.passes
        return selection
    first = _estimates(grads, candidates)
    chosen: list[Unit] = []
    excess, estimates = base_excess, first
    while len(chosen) < max_units and excess > clean_at * base_excess:
        rest = sorted(((est, u) for u, est in estimates.items() if u not in chosen), reverse=True)
        if not rest or rest[0][0] < min_gain * base_excess:
            break
        floor = max(0.5 * rest[0][0], min_gain * base_excess)
        added = [u for est, u in rest if est >= floor][: max_units - len(chosen)]
        chosen += added
        excess, grads = probe.excess(chosen, grad=True)
        estimates = _estimates(grads, candidates)
        selection.steps.append(
            {"added": [list(u) for u in added], "residual_fraction": excess / base_excess}
        )
        if progress is not None:
            progress(len(selection.steps))
    kept, effects = _prune(probe, chosen, excess, base_excess, min_gain, selection.dropped)
    for u in kept:
        effects[u]["estimated"] = first.get(u, 0.0) / base_excess
    residual = excess if kept == chosen else probe.excess(kept)[0]
    selection.chosen = kept
    selection.effects = effects
    selection.residual = residual / base_excess
    selection.passes = probe.passes
    return selection


def _estimates(grads: dict[int, torch.Tensor], candidates: Sequence[Unit]) -> dict[Unit, float]:
    """Estimated excess removed by zeroing each candidate: the gradient wrt its gate."""
    return {(lay, u): float(grads[lay][u]) for lay, u in candidates}


def _prune(
    probe: CausalProbe,
    chosen: list[Unit],
    excess: float,
    base_excess: float,
    min_gain: float,
    dropped: list[dict[str, Any]],
) -> tuple[list[Unit], dict[Unit, dict[str, float]]]:
    """Measure each chosen unit exactly, zeroed alone and restored alone (the others zeroed); a
    unit that changes the excess neither way is a bystander of the set and is dropped."""
    kept: list[Unit] = []
    effects: dict[Unit, dict[str, float]] = {}
    for u in chosen:
        alone = (base_excess - probe.excess([u])[0]) / base_excess
        in_set = (probe.excess([v for v in chosen if v != u])[0] - excess) / base_excess
        if max(alone, in_set) >= min_gain:
            kept.append(u)
            effects[u] = {"alone": alone, "in_set": in_set}
        else:
            dropped.append(
                {
                    "layer": u[0],
                    "unit": u[1],
                    "alone": alone,
                    "in_set": in_set,
                    "reason": "zeroing it alone removes no outlier excess, and restoring it "
                    "alone with the others zeroed brings none back",
                }
            )
    return kept, effects
