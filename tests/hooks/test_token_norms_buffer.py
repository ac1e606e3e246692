"""TokenNorms keeps its rows in one growing buffer: same results, few allocations, clear errors."""

from __future__ import annotations

import pytest
import torch

from vitreg import HookContext, InputError, TokenNorms

CTX = HookContext("blocks.0.hook_resid_post", 0, None)


def feed(r: TokenNorms, t: torch.Tensor, offset: int, batch: int = 3) -> None:
    for start in range(0, len(t), batch):
        r(t[start : start + batch], CTX, offset + start)


def test_rows_merge_and_limit_like_a_dict_of_images() -> None:
    t = torch.randn(10, 5, 8)
    whole, first, second = TokenNorms("s"), TokenNorms("s"), TokenNorms("s")
    feed(whole, t, 0)
    feed(second, t[6:], 6)  # the later "process" merges into an empty reducer, then the first
    feed(first, t[:6], 0)
    second.merge(first)
    for r in (whole, second):
        res = r.result()
        torch.testing.assert_close(res["norms"], t.norm(dim=-1))
        assert res["image_index"].tolist() == list(range(10))
    limited = TokenNorms("s", max_images=4)
    feed(limited, t, 0)
    assert limited.result()["image_index"].tolist() == [0, 1, 2, 3]
    assert limited.n_images == 10
    assert TokenNorms("s").result()["norms"].numel() == 0


def test_buffer_grows_by_doubling_not_per_batch() -> None:
    r = TokenNorms("s")
    buffers = set()
    for start in range(0, 300, 10):
        r(torch.randn(10, 4, 2), CTX, start)
        buffers.add(r._norms.data_ptr())
    assert len(buffers) <= 4  # 64 -> 128 -> 256 -> 512 rows
    assert r.result()["norms"].shape == (300, 4)


def test_token_count_change_is_an_input_error() -> None:
    r = TokenNorms("s")
    r(torch.randn(2, 5, 8), CTX, 0)
    with pytest.raises(InputError, match="one size"):
        r(torch.randn(2, 7, 8), CTX, 2)
