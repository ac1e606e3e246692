"""Streamed patterns: every statistic read from q and k in query chunks equals the one read from
the full ``[B, H, N, N]`` tensor, with and without masks, for any chunk size; hooks that do not
take a streamed pattern see the full tensor."""

from __future__ import annotations

import pytest
import torch

import vitreg
from vitreg.hooks.attention import softmax_pattern
from vitreg.hooks.streamed import (
    DEFAULT_CHUNK_HEAD_DIMS,
    StreamedPattern,
    attention_once,
    column_mean,
    head_gram,
    key_column,
    mark_streamed,
    pattern_chunk,
    query_rows,
    row_means,
    streamed_patterns,
)
from vitreg.testing.tiny import timm_vit

B, H, N, D = 2, 3, 11, 8


def _qk(seed: int = 0, n_k: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g) * 2
    k = torch.randn(B, H, n_k, D, generator=g) * 2
    k[:, 1, 4] += 3 * q[:, 1].mean(1)  # a key most queries attend to in head 1
    return q, k


def _masks() -> dict[str, dict]:
    g = torch.Generator().manual_seed(3)
    keep = torch.rand(N, N, generator=g) > 0.3
    keep.fill_diagonal_(True)
    return {
        "none": {},
        "bool": {"attn_mask": keep},
        "float_b1": {"attn_mask": torch.randn(B, 1, N, N, generator=g)},
        "float_row": {"attn_mask": torch.randn(1, N, generator=g)},
        "causal": {"is_causal": True},
    }


@pytest.mark.parametrize("mask", sorted(_masks()))
@pytest.mark.parametrize("chunk", [1, 4, 5, 100])
def test_every_statistic_equals_the_full_pattern(mask: str, chunk: int) -> None:
    q, k = _qk()
    kw = _masks()[mask]
    full = softmax_pattern(q, k, 0.3, kw.get("attn_mask"), kw.get("is_causal", False))
    s = StreamedPattern(q, k, 0.3, kw.get("attn_mask"), kw.get("is_causal", False), chunk=chunk)
    assert s.shape == full.shape
    assert torch.equal(s.full(), full)
    torch.testing.assert_close(column_mean(s), column_mean(full), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(query_rows(s, slice(2, 4)), full[:, :, 2:4], rtol=1e-5, atol=1e-7)
    key = column_mean(full).argmax(-1)
    torch.testing.assert_close(key_column(s, key), key_column(full, key), rtol=1e-5, atol=1e-7)
    bi, hi = torch.tensor([0, 1, 1]), torch.tensor([1, 0, 2])
    v = torch.randn(3, N, D, generator=torch.Generator().manual_seed(9))
    gram = head_gram(full, bi, hi, v)
    torch.testing.assert_close(
        head_gram(s, bi, hi, v), gram, rtol=1e-4, atol=1e-6 * gram.abs().max()
    )
    stats = row_means(s, (1, 3))
    entropy = -torch.special.xlogy(full, full).sum(-1).mean((1, 2))
    top3 = full.topk(3, dim=-1).values.sum(-1).mean((1, 2))
    torch.testing.assert_close(stats["entropy"], entropy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats["top3"], top3, rtol=1e-5, atol=1e-6)


def test_chunks_cover_the_queries_once_and_respect_the_limit() -> None:
    q, k = _qk()
    for chunk in (1, 3, 4, 11, 50):
        slices = StreamedPattern(q, k, 1.0, chunk=chunk).slices()
        assert [i for sl in slices for i in range(sl.start, sl.stop)] == list(range(N))
        assert max(sl.stop - sl.start for sl in slices) <= chunk
    with pattern_chunk(2):
        assert StreamedPattern(q, k, 1.0).chunk == 2
    assert StreamedPattern(q, k, 1.0).chunk == DEFAULT_CHUNK_HEAD_DIMS * D
    with pytest.raises(ValueError, match="at least one query"), pattern_chunk(0):
        pass


def test_plain_hooks_get_the_full_tensor_and_marked_hooks_the_stream() -> None:
    module, size = timm_vit("dinov2")
    model = vitreg.wrap(module)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    name = "blocks.1.attn.hook_pattern"
    seen: dict[str, object] = {}

    def plain(t, hook):
        seen["plain"] = t

    def marked(t, hook):
        seen["marked"] = t

    mark_streamed(marked, True)
    with torch.no_grad():
        model.run_with_hooks(x, [(name, plain), (name, marked)])
    assert isinstance(seen["plain"], torch.Tensor)
    assert isinstance(seen["marked"], StreamedPattern)
    assert torch.equal(seen["marked"].full(), seen["plain"])
    _, cache = model.run_with_cache(x, names=name)
    assert torch.equal(cache[name], seen["plain"])
    with streamed_patterns(False), torch.no_grad():
        model.run_with_hooks(x, [(name, marked)])
    assert isinstance(seen["marked"], torch.Tensor)


@pytest.mark.parametrize("mask", sorted(_masks()))
@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_attend_gives_the_attention_output_and_the_statistics(mask: str, chunk: int) -> None:
    q, k = _qk()
    v = torch.randn(B, H, N, 5, generator=torch.Generator().manual_seed(4))
    kw = _masks()[mask]
    full = softmax_pattern(q, k, 0.3, kw.get("attn_mask"), kw.get("is_causal", False))
    s = StreamedPattern(q, k, 0.3, kw.get("attn_mask"), kw.get("is_causal", False), chunk=chunk)
    torch.testing.assert_close(s.attend(v), full @ v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(column_mean(s), column_mean(full), rtol=1e-5, atol=1e-6)
    key = column_mean(full).argmax(-1)
    torch.testing.assert_close(key_column(s, key), key_column(full, key), rtol=1e-5, atol=1e-7)


def test_a_hook_reading_columns_gets_the_attention_computed_once() -> None:
    """The block's own SDPA call is answered by the streamed pattern (its statistics filled in
    the same pass); the forward stays within float rounding of the bare one, and the model's
    SDPA is itself again after the block."""
    module, size = timm_vit("dinov2")
    model = vitreg.wrap(module)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    seen: list[StreamedPattern] = []

    def columns(t, hook):
        assert torch.nn.functional.scaled_dot_product_attention is sdpa
        seen.append(t)

    mark_streamed(columns, True, columns=True)
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(model.n_layers)]
    with torch.no_grad():
        bare = model.features(x)
        out = model.run_with_hooks(x, [(n, columns) for n in names])
    assert len(seen) == model.n_layers
    assert all({"column_sum", "lse"} <= set(p._memo) for p in seen)
    torch.testing.assert_close(out, bare, rtol=1e-4, atol=1e-5)
    with attention_once(False), torch.no_grad():
        seen.clear()
        assert torch.equal(model.run_with_hooks(x, [(n, columns) for n in names]), bare)
    assert not any("column_sum" in p._memo for p in seen)
