"""The sink-vs-random masking control: each edit against its definition (softmax with a -inf
logit; a zeroed value), the kinds plants (a NOP sink matters through the score path only, a
broadcast sink through the value path too; random keys barely matter), diagnose's option, and
named errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitreg
from vitreg.analysis.diagnose import diagnose, with_control
from vitreg.analysis.norms import NormAnalysis
from vitreg.analysis.sink_control import _score_edit, _value_edit, bootstrap, sink_control
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.testing.planted import build_kind

X = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(5))


def test_score_edit_is_softmax_with_the_key_at_minus_infinity() -> None:
    logits = torch.randn(3, 2, 5, 6, generator=torch.Generator().manual_seed(0))
    keys = {(0, 1): torch.tensor([0, 4, 2])}
    got = _score_edit([1], keys, 0)(logits.softmax(-1), None)
    want = logits.clone()
    want[torch.arange(3), 1, :, keys[(0, 1)]] = float("-inf")
    want = want.softmax(-1)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.equal(got[:, 0], logits.softmax(-1)[:, 0])  # other heads untouched


def test_value_edit_zeroes_one_key_of_one_head_per_image() -> None:
    v = torch.randn(2, 5, 3, 4)
    got = _value_edit([2], {(1, 2): torch.tensor([1, 3])}, 1)(v, None)
    changed = (got != v).any(-1)  # [B, N, H]
    assert changed.nonzero().tolist() == [[0, 1, 2], [1, 3, 2]]
    assert torch.all(got[[0, 1], [1, 3], 2] == 0)


def _control(name: str, heads: list) -> tuple:
    model = vitreg.wrap(build_kind(name)[0])
    c = sink_control(model, X, heads, batch_size=4, seed=1)
    return c.score, c.value


def test_nop_plant_matters_through_the_score_path() -> None:
    score, value = _control("kinds_nop_sink", [(2, 1)])
    # removing the NOP key spreads the head's attention over the patches' values
    assert score.sink.low > 0.05 and score.random.high < 1e-4
    assert score.difference.low > 0.05 and score.ratio > 1e3
    # its value is ~0 already (a NOP sink): zeroing it changes far less than removing the key
    assert value.sink.mean < score.sink.mean / 10


def test_broadcast_plant_matters_through_the_value_path() -> None:
    score, value = _control("kinds_broadcast_sink", [(3, 2)])
    # the head writes its sink's value into every token: zeroing it removes the write
    assert value.sink.low > 0.05 and value.random.high < 1e-4 and value.difference.low > 0.05
    # the patches' values in that head are 0, so removing the key removes the same write
    assert score.sink.mean == pytest.approx(value.sink.mean, rel=0.1)


def test_diagnose_option_runs_the_control_on_the_sink_heads() -> None:
    model = vitreg.wrap(build_kind("kinds_broadcast_sink")[0])
    res = diagnose(model, X, analyses=[NormAnalysis(), SinkAnalysis()], sink_control=True)
    control = res.results.sinks.control
    assert control.heads == [[3, 2]] and control.n_images == 8
    again = type(res.results).model_validate_json(res.results.model_dump_json())
    assert again.sinks.control == control
    plain = diagnose(model, X, analyses=[NormAnalysis(), SinkAnalysis()])
    assert plain.results.sinks.control is None


def test_no_sink_head_gives_no_paths_and_says_why() -> None:
    model = vitreg.wrap(build_kind("kinds_clean")[0])
    c = sink_control(model, X, [])
    assert c.score is None and c.value is None and "no sink head" in c.notes[0]


def test_bad_input_is_a_named_error() -> None:
    model = vitreg.wrap(build_kind("kinds_clean")[0])
    with pytest.raises(InputError, match="outside the model's 6 blocks"):
        sink_control(model, X, [(9, 0)])
    with pytest.raises(InputError, match="no images"):
        sink_control(model, [], [(1, 0)])
    with pytest.raises(UnsupportedModelError, match="needs the sink analysis: no patterns"):
        with_control(model, X, {}, {"sinks": "no patterns"}, 4, None)


def test_bootstrap_interval_holds_the_mean() -> None:
    values = np.random.default_rng(0).normal(1.0, 0.1, 200)
    iv = bootstrap(values, np.random.default_rng(1))
    assert iv.low < iv.mean < iv.high and iv.high - iv.low < 0.05


def test_a_read_only_pattern_site_is_a_named_error() -> None:
    pytest.importorskip("open_clip")
    from vitreg.testing import tiny

    tower = tiny.open_clip_tower("gelu")  # nn.MultiheadAttention returns weights, takes none back
    model = vitreg.wrap(tower)
    with pytest.raises(UnsupportedModelError, match="cannot edit this model's score path"):
        sink_control(model, tiny.open_clip_images(tower, 2), [(0, 0)])
