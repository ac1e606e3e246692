"""Tiles of a streamed pattern's pass: on a CPU the batch and the queries are split so that a
tile's scores stay within the byte budget, every (image, query) is covered once, and the
statistics and attention output equal the full pattern's for any split and mask."""

from __future__ import annotations

import pytest
import torch

from vitreg.hooks import streamed
from vitreg.hooks.attention import additive_mask, softmax_pattern
from vitreg.hooks.streamed import StreamedPattern, column_mean, key_column

B, H, N, D = 3, 2, 9, 4


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, N, D, generator=g) * 2 for _ in range(3))
    k[:, 0, 2] += 3 * q[:, 0].mean(1)  # a key most queries attend to in head 0
    return q, k, v


def _masks() -> dict[str, dict]:
    g = torch.Generator().manual_seed(2)
    keep = torch.rand(B, 1, N, N, generator=g) > 0.3
    keep |= torch.eye(N, dtype=torch.bool)
    return {
        "none": {},
        "bool_per_image": {"attn_mask": keep},
        "float_per_image": {"attn_mask": torch.randn(B, H, N, N, generator=g)},
        "causal": {"is_causal": True},
    }


@pytest.mark.parametrize("least_rows", [1, 3])
@pytest.mark.parametrize("budget_rows", [1, 2, 5, 9, 20, 1000])
@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_tiles_cover_every_image_head_and_query_once_within_the_budget(
    least_rows: int, budget_rows: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``budget_rows``: the budget in one head's query rows (so below ``H`` rows a tile splits
    the heads); a tile exceeds the budget only to hold one head's ``least_rows`` queries."""
    monkeypatch.setattr(streamed, "CPU_CHUNK_BYTES", budget_rows * 4 * N)
    monkeypatch.setattr(streamed, "CPU_TILE_ROWS", least_rows)
    q, k, _ = _inputs()
    tiles = StreamedPattern(q, k, 0.5, chunk=chunk).tiles()
    seen = [
        (b, h, i)
        for im, hs, sl in tiles
        for b in range(im.start, im.stop)
        for h in range(hs.start, hs.stop)
        for i in range(sl.start, sl.stop)
    ]
    assert sorted(seen) == [(b, h, i) for b in range(B) for h in range(H) for i in range(N)]
    for im, hs, sl in tiles:
        rows = sl.stop - sl.start
        assert rows <= chunk
        size = (im.stop - im.start) * (hs.stop - hs.start) * rows
        assert size <= max(budget_rows, min(least_rows, chunk, N))
        assert hs == slice(0, H) or im.stop - im.start == 1  # images share whole-head tiles


@pytest.mark.parametrize("mask", sorted(_masks()))
@pytest.mark.parametrize("budget_rows", [1, 4, 10, 1000])
def test_attend_over_tiles_equals_the_full_pattern(
    mask: str, budget_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streamed, "CPU_CHUNK_BYTES", budget_rows * 4 * N)
    monkeypatch.setattr(streamed, "CPU_TILE_ROWS", 1)
    q, k, v = _inputs()
    kw = _masks()[mask]
    full = softmax_pattern(q, k, 0.5, kw.get("attn_mask"), kw.get("is_causal", False))
    s = StreamedPattern(q, k, 0.5, kw.get("attn_mask"), kw.get("is_causal", False), chunk=4)
    out = s.attend(v)
    torch.testing.assert_close(out, full @ v, rtol=1e-5, atol=1e-6)
    assert out.transpose(1, 2).is_contiguous()  # laid out as the CPU's fused kernel lays it out
    torch.testing.assert_close(column_mean(s), column_mean(full), rtol=1e-5, atol=1e-6)
    scores = (q * 0.5) @ k.transpose(-2, -1)
    bias = additive_mask(N, scores, kw.get("attn_mask"), kw.get("is_causal", False))
    lse = torch.logsumexp(scores if bias is None else scores + bias, dim=-1)
    torch.testing.assert_close(s.memo("lse"), lse, rtol=1e-5, atol=1e-5)
    key = column_mean(full).argmax(-1)
    torch.testing.assert_close(key_column(s, key), key_column(full, key), rtol=1e-5, atol=1e-7)
