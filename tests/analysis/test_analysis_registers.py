"""The attention each token type receives, by hand."""

from __future__ import annotations

import pytest
import torch

from vitreg.analysis.registers import ReceivedAttention
from vitreg.core.layout import TokenLayout
from vitreg.hooks.sites import HookContext


def test_received_attention_by_token_type() -> None:
    layout = TokenLayout(1, 1, (1, 2), (14, 14))  # [CLS], one register, two patches
    rows = torch.tensor([[0.1, 0.5, 0.2, 0.2], [0.3, 0.3, 0.4, 0.0]])
    pattern = torch.stack([rows[0].expand(4, 4), rows[1].expand(4, 4)])[:, None]  # [2, 1, 4, 4]
    received = ReceivedAttention("blocks.0.attn.hook_pattern", 0)
    ctx = HookContext(received.site, 0, layout)
    received(pattern[:1], ctx, 0)
    other = ReceivedAttention(received.site, 0)
    other(pattern[1:], ctx, 1)
    received.merge(other)
    got = received.result()
    assert set(got) == {"cls", "register", "patch"}
    assert all(isinstance(v, float) for v in got.values())
    assert got["cls"] == pytest.approx(0.2) and got["register"] == pytest.approx(0.4)
    assert got["patch"] == pytest.approx(0.4)
