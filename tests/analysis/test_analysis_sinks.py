"""Sink rules against a hand computation (naive A u and its singular values); the plants are
recovered in tests/analysis/test_analysis_kinds.py."""

from __future__ import annotations

import pytest
import torch

from vitreg.analysis.sink_rules import HeadStats, head_stats, sink_class, sqrt_psd
from vitreg.analysis.sinks import SinkPatterns, SinkValues, _Pair, summarise, transition_block
from vitreg.core.layout import TokenLayout
from vitreg.hooks.sites import HookContext
from vitreg.results.kinds import SinkBlock


def test_rule_matches_a_hand_computation() -> None:
    g = torch.Generator().manual_seed(0)
    b, h, n, d, c = 2, 3, 7, 4, 12
    logits = torch.randn(b, h, n, n, generator=g)
    logits[0, 1, :, 2] += 6.0  # head 1 of image 0 sinks on token 2
    logits[1, 2, :5, 4] += 6.0  # 5 of 7 queries only: no event
    a = logits.softmax(-1)
    v = torch.randn(b, n, h, d, generator=g)
    w = torch.randn(c, h, d, generator=g)
    gamma = torch.rand(c, generator=g) + 0.1
    metric = torch.einsum("chd,che->hde", w * gamma[:, None, None], w * gamma[:, None, None])
    stats = head_stats(a, v, metric, lambda: sqrt_psd(metric))
    u = torch.einsum("bnhd,chd->bhnc", v, w) * gamma  # u_j = gamma * W_O^h v_j
    for i in range(b):
        for j in range(h):
            col = a[i, j].mean(0)
            s = int(col.argmax())
            assert int(stats.key[i, j]) == s
            routed = float((a[i, j][:, s] >= 0.5).float().mean())
            assert float(stats.routed[i, j]) == pytest.approx(routed)
            if routed >= 0.9:
                norms = u[i, j].norm(dim=-1)
                others = torch.cat([norms[:s], norms[s + 1 :]]).mean()
                ratio = float(norms[s] / others)
                assert float(stats.ratio[i, j]) == pytest.approx(ratio, rel=1e-4)
                sv = torch.linalg.svdvals((a[i, j] @ u[i, j]).double())
                want = float((sv**2).sum() / sv[0] ** 2)
                assert float(stats.stable_rank[i, j]) == pytest.approx(want, rel=1e-6)
            else:  # the classes need neither outside events
                assert torch.isnan(stats.ratio[i, j]) and torch.isnan(stats.stable_rank[i, j])
    assert stats.event.tolist() == [[False, True, False], [False, False, False]]


def test_classes_at_the_published_thresholds() -> None:
    ratio = torch.tensor([0.2, 0.21, 0.5, 0.5, 3.0], dtype=torch.float64)
    rank = torch.tensor([9.0, 1.0, 1.5, 1.51, 1.2], dtype=torch.float64)
    assert sink_class(ratio, rank) == ["nop", "other", "broadcast", "other", "broadcast"]


def test_transition_from_cls_to_patches() -> None:
    blocks = [
        SinkBlock(block=0, on_cls=2.0),
        SinkBlock(block=1, on_cls=1.0, on_patch=0.5),
        SinkBlock(block=2, on_cls=0.5, on_patch=1.0),
        SinkBlock(block=3),
        SinkBlock(block=4, on_patch=2.0),
    ]
    assert transition_block(blocks) == 2
    assert transition_block([SinkBlock(block=0, on_patch=1.0)]) is None  # never on [CLS] first
    assert transition_block([*blocks, SinkBlock(block=5, on_cls=3.0)]) is None


def test_the_pair_keeps_head_stats_in_image_order() -> None:
    g = torch.Generator().manual_seed(1)
    layout = TokenLayout(1, 0, (2, 3), (14, 14))  # [CLS] + 6 patches
    b, h, n, d, c = 3, 2, layout.n_tokens, 4, 6
    logits = torch.randn(b, h, n, n, generator=g)
    logits[:, 0, :, 3] += 8.0  # head 0 sinks on token 3 (a patch) in every image
    a = logits.softmax(-1)
    v = torch.randn(b, n, h, d, generator=g)
    w = torch.randn(c, h, d, generator=g)
    metric = torch.einsum("chd,che->hde", w, w)
    pair = _Pair(metric)
    values = SinkValues("blocks.0.attn.hook_v", pair)
    patterns = SinkPatterns("blocks.0.attn.hook_pattern", pair, 0)
    for lo, hi in ((1, 3), (0, 1)):  # the later images first
        patterns(a[lo:hi], HookContext(patterns.site, 0, layout), lo)
        values(v[lo:hi], HookContext(values.site, 0, layout), lo)
    res = patterns.result()
    want = head_stats(a, v, metric, lambda: sqrt_psd(metric))
    assert isinstance(res["stats"], HeadStats) and res["layer"] == 0 and res["layout"] is layout
    for field in ("key", "routed", "ratio", "stable_rank"):
        got = getattr(res["stats"], field)
        torch.testing.assert_close(got, getattr(want, field), equal_nan=True)
    assert values.result() is None  # the statistics are the pattern half's
    sinks = summarise([res], n_images=b)
    assert [(x.head, x.key_type, x.key_position) for x in sinks.heads] == [(0, "patch", [0, 2])]
    empty = SinkPatterns("blocks.1.attn.hook_pattern", _Pair(metric), 1).result()
    assert empty["stats"] is None
    assert summarise([res, empty], n_images=b) == sinks  # a block no image reached adds nothing
