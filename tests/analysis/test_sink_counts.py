"""The reference's own counts: the tables' rule (raw value ratio before W_O, no stable-rank
condition, blocks >= 1), Definition 1 per epsilon, block 0 apart, and the per-class head
selection; against hand-built statistics, a hand computation and the kinds plants."""

from __future__ import annotations

import pytest
import torch

import vitreg
from vitreg.analysis.base import run_analyses
from vitreg.analysis.sink_counts import reference_counts, reference_heads
from vitreg.analysis.sink_rules import HeadStats, head_stats, sqrt_psd
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.testing.planted import build_kind

LAYOUT = TokenLayout(1, 1, (2, 2), (14, 14))  # [CLS], 1 register, 4 patches
NAN = float("nan")


def _stats(key, routed, min_a, ratio_head, ratio, rank) -> HeadStats:
    t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    z = torch.zeros(len(key), len(key[0]))
    return HeadStats(
        torch.tensor(key), z, t(routed), t(ratio), t(rank), t(min_a), t(ratio_head), z + 1
    )


def _blocks() -> list:
    # 2 images x 2 heads per block; events where routed >= 0.9
    b0 = _stats(
        [[0, 2], [0, 0]],
        [[1.0, 0.1], [1.0, 0.0]],
        [[0.95, 0.0], [0.6, 0.0]],
        [[0.1, NAN], [0.1, NAN]],
        [[0.1, NAN], [0.1, NAN]],
        [[9.0, NAN], [9.0, NAN]],
    )
    b1 = _stats(
        [[3, 1], [0, 4]],
        [[1.0, 0.95], [0.2, 1.0]],
        [[0.75, 0.3], [0.0, 0.92]],
        # head 0: raw 0.1 (NOP in the tables) but output ratio 0.6 with rank 3 ("other")
        [[0.1, 0.7], [NAN, 0.3]],
        [[0.6, 0.7], [NAN, 0.1]],
        [[3.0, 1.2], [NAN, 9.0]],
    )
    return [(0, b0, LAYOUT), (1, b1, LAYOUT)]


def test_tables_rule_and_definition1_count_by_hand() -> None:
    ref = reference_counts(_blocks(), 2, eps=(0.5, 0.2), min_events=1)
    relaxed, d05, d02 = ref.rules
    assert relaxed.name == "relaxed" and relaxed.eps is None and d02.eps == 0.2
    # blocks >= 1, relaxed: 3 events over 2 images: keys 3 (patch), 1 (register), 4 (patch)
    r = relaxed.from_block1
    assert r.events.total == 1.5 and r.events.on_patch == 1.0 and r.events.on_register == 0.5
    assert r.nop.total == 0.5 and r.nop.on_patch == 0.5  # raw 0.1; the Section-4 class: other
    assert r.broadcast.total == 0.5 and r.broadcast.on_register == 0.5  # raw 0.7
    # 0.3 is neither: it counts toward the events only
    assert d05.from_block1.events.total == 1.0  # min_a 0.75 and 0.92 (0.3 is not >= 0.5)
    assert d02.from_block1.events.total == 0.5  # only min_a 0.92 >= 0.8
    assert d02.from_block1.nop.total == 0.0 and d02.from_block1.broadcast.total == 0.0
    # block 0 apart: two [CLS] events (NOP by the raw ratio), one of them with min_a >= 0.8
    assert relaxed.block0.events.on_cls == 1.0 and relaxed.block0.nop.total == 1.0
    assert d02.block0.events.total == 0.5 and d05.block0.events.total == 1.0


def test_head_selection_uses_section4_classes_and_keeps_block0_apart() -> None:
    heads = reference_heads(_blocks(), min_events=1, k_deep=16, k_block0=4)
    assert [(h.block, h.head, h.n_events) for h in heads.nop] == [(1, 1, 1)]  # ratio 0.1
    assert [(h.block, h.head, h.n_events) for h in heads.broadcast] == [(1, 1, 1)]  # 0.7, 1.2
    # head 0 of block 1 is NOP by the tables' raw ratio but "other" by Section 4: never selected
    assert all(h.head != 0 for h in heads.nop + heads.broadcast)
    assert [(h.block, h.head, h.n_events) for h in heads.nop_block0] == [(0, 0, 2)]
    assert heads.nop_block0[0].event_rate == 1.0
    assert reference_heads(_blocks(), min_events=2).nop == []  # needs two events of the class


def test_raw_ratio_and_min_a_match_a_hand_computation() -> None:
    g = torch.Generator().manual_seed(0)
    b, h, n, d = 2, 2, 6, 3
    logits = torch.randn(b, h, n, n, generator=g)
    logits[0, 1, :, 4] += 8.0
    a = logits.softmax(-1)
    v = torch.randn(b, n, h, d, generator=g)
    metric = torch.eye(d).expand(h, d, d).clone()
    st = head_stats(a, v, metric, lambda: sqrt_psd(metric))
    for i in range(b):
        for j in range(h):
            s = int(a[i, j].mean(0).argmax())
            assert float(st.min_a[i, j]) == pytest.approx(float(a[i, j][:, s].min()))
            if st.event[i, j]:
                norms = v[i, :, j].norm(dim=-1)
                want = norms[s] / torch.cat([norms[:s], norms[s + 1 :]]).mean()
                assert float(st.ratio_head[i, j]) == pytest.approx(float(want), rel=1e-5)
            else:
                assert torch.isnan(st.ratio_head[i, j])
    assert st.event.tolist() == [[False, True], [False, False]]


def test_register_plant_counts_two_nop_events_per_image() -> None:
    model = vitreg.wrap(build_kind("kinds_registers")[0])
    x = torch.randn(6, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    res, _, _ = run_analyses(model, x, [SinkAnalysis()], batch_size=3)
    ref = res["sinks"].reference_counts
    for rule in ref.rules:  # attention ~0.9999 on the register: every rule sees both plants
        c = rule.from_block1
        assert c.events.total == 2.0 and c.nop.on_register == 2.0 and c.broadcast.total == 0.0
        assert rule.block0.events.total == 0.0
    assert ref.heads.nop == []  # 6 images: no head reaches the reference's 50 events
    picked = reference_heads(_stats_of(model, x), min_events=6)
    assert [(h.block, h.head, h.n_events) for h in picked.nop] == [(4, 0, 6), (2, 0, 6)]


def _stats_of(model, x):
    from vitreg.analysis.sinks import SinkPatterns

    trace = model.trace(x, SinkAnalysis().reducers(model), batch_size=3)
    out = [r.result() for r in trace.reducers if isinstance(r, SinkPatterns)]
    return [(r["layer"], r["stats"], r["layout"]) for r in out]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(eps=(0.6,)), r"\(0, 0.5\]"),
        (dict(eps=(0.0,)), r"\(0, 0.5\]"),
        (dict(nop_ratio=0.6, broadcast_ratio=0.5), "NOP ratio <= broadcast"),
        (dict(nop_ratio=-0.1), "NOP ratio <= broadcast"),
        (dict(min_events=0), "min_events >= 1"),
    ],
)
def test_thresholds_out_of_range_are_named_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(InputError, match=match):
        reference_counts(_blocks(), 2, **kwargs)


def test_graded_plant_separates_definition1_epsilons() -> None:
    # [CLS] gets ~0.24, ~0.87 and ~0.997 of every query's attention in three heads
    module, truth = build_kind("kinds_graded_sinks")
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    res, _, _ = run_analyses(vitreg.wrap(module), x, [SinkAnalysis()], batch_size=2)
    counts = {r.eps: r.from_block1 for r in res["sinks"].reference_counts.rules}
    for eps in (None, 0.5, 0.3, 0.2):  # the 0.87 head counts down to eps 0.2 ...
        assert counts[eps].events.on_cls == 2.0 and counts[eps].nop.total == 2.0
    assert counts[0.1].events.total == 1.0  # ... but not at eps 0.1 (0.87 < 0.9)
    found = {(h.block, h.head, h.kind) for h in res["sinks"].heads}
    assert found == {(s.block, s.head, s.kind) for s in truth.sinks}
