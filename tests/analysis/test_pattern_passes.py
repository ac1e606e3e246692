"""Only what is read is computed: a block whose pattern no analysis reads gets no pass over its
q and k, readers of the [CLS] row get that row alone, and a block whose column statistics are
read gets exactly one pass (its attention computed with them), however many analyses read it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

import vitreg
from vitreg.analysis.attention import AttentionAnalysis
from vitreg.analysis.base import run_analyses
from vitreg.analysis.diagnose import diagnose
from vitreg.analysis.norms import NormAnalysis
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.hooks.streamed import StreamedPattern
from vitreg.testing.tiny import timm_vit

BATCHES = 2


@contextmanager
def counting() -> Iterator[dict[str, list[int]]]:
    """Per pass kind, the query rows of every pass over a streamed pattern: ``scan`` (the
    statistics alone), ``attend`` (with the attention output), ``rows`` (some rows' probabilities)."""
    seen: dict[str, list[int]] = {"scan": [], "attend": [], "rows": []}
    scan, rows = StreamedPattern._scan, StreamedPattern.rows

    def counted_scan(self: StreamedPattern, row_fns: dict, *v: torch.Tensor) -> torch.Tensor | None:
        seen["attend" if v else "scan"].append(self.shape[2])
        return scan(self, row_fns, *v)

    def counted_rows(self: StreamedPattern, sl: slice) -> torch.Tensor:
        seen["rows"].append(sl.stop - sl.start)
        return rows(self, sl)

    StreamedPattern._scan, StreamedPattern.rows = counted_scan, counted_rows
    try:
        yield seen
    finally:
        StreamedPattern._scan, StreamedPattern.rows = scan, rows


def _model() -> tuple[vitreg.Model, torch.Tensor]:
    module, size = timm_vit("dinov2")
    x = torch.randn(2 * BATCHES, 3, size, size, generator=torch.Generator().manual_seed(0))
    return vitreg.wrap(module), x


def test_a_block_nobody_reads_gets_no_pass() -> None:
    model, x = _model()
    assert model.n_layers > 2
    sinks = [r for r in SinkAnalysis().reducers(model) if r.site.startswith("blocks.1.")]
    with counting() as seen, torch.no_grad():
        trace = model.trace(x, sinks, batch_size=2)
    assert seen["attend"] == [model.layout.n_tokens] * BATCHES  # block 1 alone, once a batch
    assert seen["scan"] == seen["rows"] == []
    assert set(trace.attn_source) == {"blocks.1.attn.hook_pattern"}


def test_cls_readers_get_the_cls_row_alone() -> None:
    model, x = _model()
    with counting() as seen:
        run_analyses(model, x, [NormAnalysis(), AttentionAnalysis()], batch_size=2)
    assert seen["scan"] == seen["attend"] == []
    assert seen["rows"] == [model.layout.n_cls] * (model.n_layers * BATCHES)


def test_diagnose_passes_over_each_block_once() -> None:
    """Attention, sinks and registers all read every block: one pass each, the attention's."""
    model, x = _model()
    with counting() as seen:
        diagnose(model, x, batch_size=2, max_maps=2)
    assert seen["attend"] == [model.layout.n_tokens] * (model.n_layers * BATCHES)
    assert seen["scan"] == []
    assert seen["rows"] == [model.layout.n_cls] * (model.n_layers * BATCHES)
