"""The pruning scores: SToP's sink score by its formula, the attention arms read off a pattern
through the token layout, keep counts and the keep-ratio errors."""

from __future__ import annotations

import pytest
import torch

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.probe.pruning_scores import (
    check_ratios,
    cls_attention,
    keep_count,
    kept_mean,
    random_ranking,
    received_attention,
    sink_aware,
    sink_score,
)


def test_sink_score_is_the_min_max_of_the_frame_mean_to_the_gamma() -> None:
    g = torch.Generator().manual_seed(0)
    attn = torch.rand(5, 30, generator=g, dtype=torch.float64).softmax(-1)
    got = sink_score(attn, gamma=1.3)
    mean = [sum(attn[f, n].item() for f in range(5)) / 5 for n in range(30)]
    powered = [m**1.3 for m in mean]
    lo, hi = min(powered), max(powered)
    want = torch.tensor([(p - lo) / (hi - lo) for p in powered], dtype=torch.float64)
    assert got.shape == (5, 30)
    assert torch.allclose(got, want.expand(5, 30), atol=1e-12)
    assert got[0].max() == pytest.approx(1.0) and got[0].min() == pytest.approx(0.0)
    assert torch.allclose(sink_aware(attn, 0.7, 1.3), attn - 0.7 * want, atol=1e-12)


def test_a_persistent_position_is_demoted_below_a_varying_one() -> None:
    attn = torch.full((4, 6), 0.01)
    attn[:, 2] = 0.5  # high in every frame: a sink
    attn[torch.arange(4), torch.tensor([0, 1, 3, 4])] = 0.3  # high in one frame each
    plain = attn.argmax(1)
    aware = sink_aware(attn, mu=0.4).argmax(1)
    assert (plain == 2).all() and (aware != 2).all()


def test_arms_read_the_cls_row_and_column_sums_through_the_layout() -> None:
    layout = TokenLayout(n_cls=1, n_reg=2, grid=(2, 2), patch_size=(4, 4))  # [cls, r, r, p*4]
    n = layout.n_tokens
    pattern = torch.zeros(1, 2, n, n)
    pattern[0, 0, 0, layout.patches] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    pattern[0, 1, 0, layout.patches] = torch.tensor([0.3, 0.2, 0.1, 0.0])
    pattern[0, :, 4, 3] = 1.0  # patch 1 looks at patch 0
    assert torch.allclose(cls_attention(pattern, layout), torch.tensor([[0.2, 0.2, 0.2, 0.2]]))
    want = torch.tensor([[0.2 + 1.0, 0.2, 0.2, 0.2]])
    assert torch.allclose(received_attention(pattern, layout), want)


def test_keep_counts_kept_means_and_the_random_ranking() -> None:
    assert [keep_count(r, 196) for r in (0.1, 0.5, 0.9, 1.0)] == [20, 98, 176, 196]
    assert keep_count(0.001, 10) == 1
    features = torch.arange(12.0).reshape(1, 4, 3)
    scores = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    assert torch.equal(kept_mean(features, scores, 2), features[0, [1, 3]].mean(0, keepdim=True))
    assert torch.equal(random_ranking(9, 4), random_ranking(9, 4))
    assert not torch.equal(random_ranking(9, 4), random_ranking(9, 5))


@pytest.mark.parametrize("ratios", [(0.0,), (1.5,), (-0.1, 0.5), (), (0.5, 0.5)])
def test_a_bad_keep_ratio_is_an_input_error(ratios: tuple[float, ...]) -> None:
    with pytest.raises(InputError, match="keep ratio"):
        check_ratios(ratios)
    assert check_ratios((0.1, 1.0)) == (0.1, 1.0)
