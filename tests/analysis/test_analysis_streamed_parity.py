"""diagnose's results from streamed patterns (q and k read in query chunks) equal those from the
full ``[B, H, N, N]`` patterns, field by field (rtol 1e-4), over families, image sizes and chunk
sizes, on random weights and on the planted kinds fixtures (where sinks have events)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import timm
import torch

import vitreg
from vitreg.analysis.base import run_analyses, summary_of
from vitreg.analysis.diagnose import DiagnoseResult, diagnose
from vitreg.analysis.kinds import verdicts
from vitreg.analysis.norms import NormAnalysis
from vitreg.analysis.registers import RegisterAnalysis
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.hooks.streamed import (
    StreamedPattern,
    attention_once,
    pattern_chunk,
    streamed_patterns,
)
from vitreg.testing import tiny
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build_kind

RTOL = 1e-4


def assert_same(a: Any, b: Any, where: str = "results") -> None:
    """Every field equal: numbers to ``RTOL`` (NaN equals NaN), everything else exactly."""
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert isinstance(b, float | int), where
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-7)
        assert same, f"{where}: {a} != {b}"
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=1e-7, equal_nan=True, msg=where)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@contextmanager
def counting_scans() -> Iterator[list[int]]:
    """Counts the first passes over streamed patterns: ``[statistics alone, with the attention
    output]`` (the first is 0 when every hook saw full tensors; the second counts the forward's
    attention computed once with its statistics)."""
    calls = [0, 0]
    scan = StreamedPattern._scan

    def counted(self: StreamedPattern, row_fns: dict, *values: torch.Tensor) -> torch.Tensor | None:
        calls[bool(values)] += 1
        return scan(self, row_fns, *values)

    StreamedPattern._scan = counted
    try:
        yield calls
    finally:
        StreamedPattern._scan = scan


def _diagnose(model: vitreg.Model, x: torch.Tensor) -> DiagnoseResult:
    return diagnose(model, x, batch_size=2, max_maps=2)


def assert_diagnose_parity(model: vitreg.Model, x: torch.Tensor, chunks: list[int | None]) -> None:
    for chunk in chunks:  # the forward's attention, computed once in chunks, is the same on both
        with streamed_patterns(False), pattern_chunk(chunk), counting_scans() as scans:
            full = _diagnose(model, x)
        assert scans[0] == 0
        with pattern_chunk(chunk), counting_scans() as scans:
            streamed = _diagnose(model, x)
        assert sum(scans) > 0
        assert_same(streamed.results.model_dump(), full.results.model_dump())
        a, b = streamed.traced["attention"], full.traced["attention"]
        assert_same(a.layer_maps, b.layer_maps, "layer_maps")
        assert_same(a.last_layer_heads, b.last_layer_heads, "last_layer_heads")


def _timm(arch: str, size: int, **kw: Any) -> Callable[[], tuple[vitreg.Model, torch.Tensor]]:
    def build() -> tuple[vitreg.Model, torch.Tensor]:
        torch.manual_seed(0)
        module = timm.create_model(arch, pretrained=False, img_size=size, **kw).eval()
        return vitreg.wrap(tiny.realistic_(module)), synthetic_images(4, size, seed=0)

    return build


def _eva(key: str) -> Callable[[], tuple[vitreg.Model, torch.Tensor]]:
    def build() -> tuple[vitreg.Model, torch.Tensor]:
        model, _ = tiny.eva_model(key)
        size = tiny.EVA_MODELS[key][1]
        return model, synthetic_images(4, size, seed=0)

    return build


def _open_clip() -> tuple[vitreg.Model, torch.Tensor]:
    pytest.importorskip("open_clip")
    tower = tiny.open_clip_tower("gelu")
    return vitreg.wrap(tower), tiny.open_clip_images(tower, 4)


def _hf_dinov2_reg() -> tuple[vitreg.Model, torch.Tensor]:
    pytest.importorskip("transformers")
    model = vitreg.wrap(tiny.hf_tiny("dinov2_reg"))
    return model, synthetic_images(4, tiny.hf_size(model), seed=0)


FAMILIES: dict[str, Callable[[], tuple[vitreg.Model, torch.Tensor]]] = {
    "dinov2_56": _timm("vit_small_patch14_dinov2", 56, depth=3),
    "dinov2_98": _timm("vit_small_patch14_dinov2", 98, depth=2),
    "dinov2_reg4": _timm("vit_small_patch14_reg4_dinov2", 70, depth=2),
    "clip": _timm("vit_base_patch16_clip_quickgelu_224", 64, depth=2),
    "siglip_no_cls": _timm("vit_base_patch16_siglip_224", 64, depth=2),
    "eva_dinov3_rope": _eva("dinov3"),
    "open_clip": _open_clip,
    "hf_dinov2_reg": _hf_dinov2_reg,
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_diagnose_streamed_equals_full_patterns(family: str) -> None:
    model, x = FAMILIES[family]()
    assert_diagnose_parity(model, x, [7, None])


@pytest.mark.parametrize("name", ["kinds_nop_sink", "kinds_broadcast_sink", "kinds_registers"])
@pytest.mark.parametrize("chunk", [1, 13, None])
def test_kinds_fixtures_streamed_equal_full_patterns(name: str, chunk: int | None) -> None:
    module, _ = build_kind(name)
    model = vitreg.wrap(module)
    x = torch.randn(6, 3, 64, 64, generator=torch.Generator().manual_seed(5))

    def run() -> tuple[Any, Any]:
        chosen = [NormAnalysis(), SinkAnalysis(), RegisterAnalysis()]
        res, skipped, _ = run_analyses(model, x, chosen, batch_size=3)
        return res, verdicts(res, skipped)

    with streamed_patterns(False), pattern_chunk(chunk), counting_scans() as scans:
        full, full_kinds = run()
    assert scans[0] == 0
    with pattern_chunk(chunk), counting_scans() as scans:
        streamed, kinds = run()
    assert scans[1] > 0  # every sink block's attention computed once, with its statistics
    assert full["sinks"].per_image.total > 0  # events: the per-head Gram path ran
    for name_ in ("sinks", "registers"):
        assert_same(streamed[name_].model_dump(), full[name_].model_dump(), name_)
    assert_same(kinds.model_dump(), full_kinds.model_dump(), "kinds")


@pytest.mark.parametrize("name", ["kinds_nop_sink", "kinds_broadcast_sink", "kinds_registers"])
def test_kinds_fixtures_equal_with_the_models_own_attention(name: str) -> None:
    """Attention computed once with its statistics gives the results of the model's own SDPA
    call with the statistics recomputed from q and k."""
    module, _ = build_kind(name)
    model = vitreg.wrap(module)
    x = torch.randn(6, 3, 64, 64, generator=torch.Generator().manual_seed(5))

    def run() -> Any:
        chosen = [NormAnalysis(), SinkAnalysis(), RegisterAnalysis()]
        res, skipped, _ = run_analyses(model, x, chosen, batch_size=3)
        return {k: summary_of(r).model_dump() for k, r in res.items()}, verdicts(
            res, skipped
        ).model_dump()

    with attention_once(False), counting_scans() as scans:
        own = run()
    assert scans[1] == 0
    with counting_scans() as scans:
        once = run()
    assert scans[1] > 0
    assert_same(once, own, name)


@pytest.mark.slow
@pytest.mark.parametrize("size", [224, 518])
def test_diagnose_parity_at_full_resolution(size: int) -> None:
    """ViT-S/14 (2 blocks, random weights) at 224 px (257 tokens) and 518 px (1370 tokens)."""
    model, x = _timm("vit_small_patch14_dinov2", size, depth=2)()
    assert_diagnose_parity(model, x[:2], [None, 100])


def test_sinks_under_bf16_autocast_match_the_full_patterns() -> None:
    """Under autocast the event statistics run in float32 (they once failed on bf16 ratios)."""
    module, truth = build_kind("kinds_registers")
    model = vitreg.wrap(module)
    x = torch.randn(6, 3, 64, 64, generator=torch.Generator().manual_seed(5))

    def run() -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            res, _, _ = run_analyses(model, x, [NormAnalysis(), SinkAnalysis()], batch_size=3)
        return res["sinks"]

    with streamed_patterns(False):
        full = run()
    streamed = run()
    heads = {(h.block, h.head, h.kind, h.key_type) for h in streamed.heads}
    assert heads == {(h.block, h.head, h.kind, h.key_type) for h in full.heads}
    assert heads == {(s.block, s.head, s.kind, s.key_type) for s in truth.sinks}
