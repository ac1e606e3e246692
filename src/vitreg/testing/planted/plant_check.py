"""Does a planted circuit do what its GroundTruth says? Measured on images, with plain torch hooks.

:func:`check_circuit` runs the planted model (and its unplanted twin) with units zeroed and
checks, on patches clear of the rule's threshold:

* **emergence**: the selected patches are outliers (median over the median patch norm at least
  ``0.75 x MODE_RATIO``) at the emergence block and not before it;
* **ratio**: after the last writer block the selected patches' median ratio is within a factor
  1.5 of the target, and at the detection block (the second-to-last) within a factor 2;
* **causal**: with every causal unit zeroed, every block's max/median patch norm is at most
  ``CLEAN`` x the unplanted model's on the same images (readers active: they create nothing);
* **readers**: with the causal units zeroed, every reader stays silent;
* **distractors**: silent on the selected patches, and zeroing them moves the selected patches'
  norms by under 5% at every block from emergence on;
* **together**: each weak unit (a causal unit before the emergence block, at most 2 checked)
  alone, the other causal units and the readers zeroed, makes no outlier: the selected patches'
  median ratio stays under ``0.75 x MODE_RATIO`` at every block (readers amplify any write along
  ``v`` they see, a weak one's too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitreg.testing.planted._weights import token_layout
from vitreg.testing.planted.planted_circuits import MODE_RATIO
from vitreg.testing.planted.truth import GroundTruth

CLEAN = 1.5  # "as clean as the unplanted model": max/median within this factor of its own
SILENT = 0.2  # |activation| of a unit that does not fire (GELU's minimum is -0.17)


@dataclass
class CircuitCheck:
    """The measured figures of each check and the checks that failed."""

    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)


@dataclass
class _Run:
    norms: list[torch.Tensor]  # per block, patch norms [B, N]
    acts: dict[tuple[int, int], torch.Tensor]  # watched units' activations, [B, T]


def _run(
    module: nn.Module,
    x: torch.Tensor,
    zero: Iterable[tuple[int, int]] = (),
    watch: Iterable[tuple[int, int]] = (),
) -> _Run:
    """Forward ``x`` with the ``(layer, unit)`` pairs of ``zero`` zeroed at the MLP's hidden
    layer; every block's patch norms and the activations of ``watch``."""
    patches = token_layout(module).patches
    zeroed: dict[int, list[int]] = {}
    for layer, unit in zero:
        zeroed.setdefault(layer, []).append(unit)
    watched = list(watch)
    out = _Run([], {})
    handles = []

    def hidden(layer: int):
        def hook(_m: nn.Module, args: tuple) -> tuple:
            t = args[0]
            for lay, unit in watched:
                if lay == layer:
                    out.acts[(lay, unit)] = t[..., unit].detach().clone()
            if layer in zeroed:
                t = t.clone()
                t[..., zeroed[layer]] = 0
            return (t,)

        return hook

    def resid(_m: nn.Module, _a: tuple, y: torch.Tensor) -> None:
        out.norms.append(y[:, patches].float().norm(dim=-1))

    for i, blk in enumerate(module.blocks):
        handles.append(blk.mlp.fc2.register_forward_pre_hook(hidden(i)))
        handles.append(blk.register_forward_hook(resid))
    try:
        with torch.no_grad():
            module.forward_features(x)
    finally:
        for h in handles:
            h.remove()
    return out


def _max_over_median(norms: list[torch.Tensor]) -> list[float]:
    return [float(n.max() / n.median()) for n in norms]


def _median_ratio(norms: torch.Tensor, sel: torch.Tensor) -> float:
    return float(norms[sel].median() / norms.median())


def check_circuit(
    module: nn.Module, truth: GroundTruth, images: torch.Tensor, unplanted: nn.Module
) -> CircuitCheck:
    """Check ``module`` against ``truth`` on preprocessed ``images`` (``unplanted``: the same
    architecture and random weights without the plant)."""
    c = CircuitCheck()
    layout = token_layout(module)
    b = images.shape[0]
    clear = ~truth.ambiguous_mask(images).reshape(b, -1)
    selected = truth.outlier_mask(images).reshape(b, -1)
    sel, rest = selected & clear, ~selected & clear
    c.figures["selected_patches"] = int(sel.sum())
    c.expect(bool(sel.any()) and bool(rest.any()), "the images exercise both sides of the rule")
    if not c.ok:
        return c
    e = truth.emergence_layer
    n = len(module.blocks)
    detect = n - 2
    last = max(truth.writer_layers)
    causal, readers = list(truth.causal_units), list(truth.reader_units)
    distractors = [(layer, unit) for layer, unit, _ in truth.distractor_units]
    full = _run(module, images, watch=distractors)
    control = _max_over_median(_run(unplanted, images).norms)
    ratios = [_median_ratio(nm, sel) for nm in full.norms]
    c.figures.update(
        median_ratio=ratios,
        control_max_over_median=control,
        target_ratio=truth.target_ratio,
        detect_layer=detect,
    )
    cut = 0.75 * MODE_RATIO
    c.expect(ratios[e] >= cut, f"outliers at the emergence block {e}: {ratios[e]:.2f}x")
    if e > 0:
        c.expect(ratios[e - 1] < cut, f"no outliers before block {e}: {ratios[e - 1]:.2f}x")
    target = truth.target_ratio
    c.expect(
        target / 1.5 <= ratios[last] <= 1.5 * target,
        f"ratio {ratios[last]:.2f}x after the last writer block {last} vs target {target:.2f}x",
    )
    c.expect(
        target / 2 <= ratios[detect] <= 2 * target,
        f"ratio {ratios[detect]:.2f}x at the detection block {detect} vs target {target:.2f}x",
    )
    off = _run(module, images, zero=causal, watch=readers)
    zeroed = _max_over_median(off.norms)
    c.figures["causal_zeroed_max_over_median"] = zeroed
    bad = [i for i in range(n) if zeroed[i] > CLEAN * control[i]]
    c.expect(not bad, f"causal units zeroed: blocks {bad} not as clean as the unplanted model")
    loud = [u for u, a in off.acts.items() if float(a.abs().max()) > SILENT]
    c.expect(not loud, f"readers {loud} fire with the causal units zeroed")
    if distractors:
        on_sel = [
            u for u, a in full.acts.items() if float(_on(a, layout, sel).abs().max()) > SILENT
        ]
        c.expect(not on_sel, f"distractors {on_sel} fire on outlier patches")
        moved = _run(module, images, zero=distractors).norms
        change = max(
            float((moved[i][sel] / full.norms[i][sel] - 1).abs().max()) for i in range(e, n)
        )
        c.figures["distractor_change"] = change
        c.expect(change < 0.05, f"zeroing the distractors moves outlier norms by {change:.1%}")
    weak = [u for u in causal if u[0] < e][:2]
    for u in weak:
        others = [v for v in causal if v != u] + readers
        alone = [_median_ratio(nm, sel) for nm in _run(module, images, zero=others).norms]
        bad = [i for i in range(n) if alone[i] >= cut]
        c.expect(not bad, f"weak unit {u} alone makes outliers at blocks {bad}")
    c.figures["weak_checked"] = [list(u) for u in weak]
    return c


def _on(acts: torch.Tensor, layout: Any, mask: torch.Tensor) -> torch.Tensor:
    """A unit's activations ``[B, T]`` on the patches of ``mask`` ``[B, N]``."""
    return acts[:, layout.patches][mask]
