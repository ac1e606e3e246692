"""The issue-20 kinds fixtures: loadable as planted:NAME, and each reserved channel exact."""

from __future__ import annotations

import pytest
import torch

import vitreg
from vitreg.testing.planted import (
    CLS_MARK,
    KINDS,
    POSITION_VALUE,
    KindTruth,
    build_kind,
)


def _block_outputs(module: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    outs: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda _m, _a, o: outs.append(o)) for b in module.blocks]
    with torch.no_grad():
        module.forward_features(x)
    for h in handles:
        h.remove()
    return outs


def test_every_kind_loads_by_spec_and_lists() -> None:
    names = vitreg.testing.list_planted()
    assert set(KINDS) <= set(names)
    model = vitreg.load("planted:kinds_registers")
    truth = model.module.vitreg_kind_truth
    assert isinstance(truth, KindTruth) and truth.registers_absorb
    assert model.layout.n_reg == 4 and model.layout.grid == (8, 8)
    assert model.weights == "planted"
    assert truth.model_dump(mode="json")["sinks"][0]["key_type"] == "register"


def test_reserved_channels_hold_their_planted_values() -> None:
    module, truth = build_kind("kinds_position")
    x = torch.randn(3, 3, 64, 64)
    c_cls, c_pos = truth.reserved[0], truth.position_channel
    patches = slice(1, None)
    for out in _block_outputs(module, x):
        assert torch.allclose(out[:, 0, c_cls], torch.full((3,), CLS_MARK))
        pos = out[:, patches, c_pos]
        planted = torch.zeros(64, dtype=torch.bool)
        planted[list(truth.positions)] = True
        assert torch.allclose(pos[:, planted], torch.full_like(pos[:, planted], POSITION_VALUE))
        assert pos[:, ~planted].abs().max() == 0


def test_massive_unit_writes_only_into_cls_from_its_block() -> None:
    module, truth = build_kind("kinds_massive")
    (first, _, _, channel) = truth.massive[0]
    outs = _block_outputs(module, torch.randn(2, 3, 64, 64))
    assert outs[first - 1][:, :, channel].abs().max() == 0
    for out in outs[first:]:
        assert (out[:, 0, channel] > 500).all()
        assert out[:, 1:, channel].abs().max() < 1e-3


def test_seed_changes_channels_and_unknown_name_is_clear() -> None:
    assert (
        build_kind("kinds_massive", seed=1)[1].reserved != build_kind("kinds_massive")[1].reserved
    )
    with pytest.raises(vitreg.errors.SpecError, match="kinds_"):
        build_kind("kinds_nothing")
