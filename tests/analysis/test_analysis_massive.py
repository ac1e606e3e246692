"""Massive activations against a hand computation of Sun et al.'s criterion."""

from __future__ import annotations

import pytest
import torch

from vitreg.analysis.massive import MassiveEntries, summarise
from vitreg.core.layout import TokenLayout
from vitreg.hooks.sites import HookContext
from vitreg.results.kinds import Massive


def test_criterion_matches_a_hand_computation() -> None:
    layout = TokenLayout(1, 0, (2, 2), (8, 8))
    x = torch.full((2, 5, 8), 0.05)
    x[0, 0, 3] = 120.0  # > 100 and 2400x the median 0.05: massive
    x[0, 2, 1] = -90.0  # 1800x the median but not > 100: not massive
    x[1, 4, 6] = 101.0
    x[1, :, :6] = 0.2  # raises image 1's median to 0.2: 101 is only 505x it
    reducer = MassiveEntries("blocks.0.hook_resid_post", 0)
    reducer(x, HookContext("blocks.0.hook_resid_post", 0, layout), 0)
    res = reducer.result()
    assert res["entries"][:, :3].tolist() == [[0.0, 0.0, 3.0]]
    assert res["medians"][0] == pytest.approx(0.05) and res["medians"][1] == pytest.approx(0.2)
    assert res["site"] == reducer.site and res["layout"] is layout and res["layer"] == 0
    out = summarise([res], n_images=2)
    (channel,) = out.channels
    assert (channel.channel, channel.token_types, channel.top_tokens) == (3, {"cls": 1}, [0])
    assert channel.max_value == 120.0 and channel.max_over_median == pytest.approx(2400.0)
    assert out.first_block == 0 and out.present
    assert isinstance(out, Massive) and out.channels[0].hits_per_image == 0.5


def test_nothing_massive_in_an_ordinary_state() -> None:
    reducer = MassiveEntries("s", 0)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0))
    reducer(x, HookContext("s", 0, None), 0)
    res = reducer.result()
    assert res["site"] == "s" and res["layout"] is None
    out = summarise([res], n_images=3)
    assert not out.present and out.first_block is None
