"""``run_with_cache`` stores what it shows: views (slices, q out of qkv) never pin their base."""

from __future__ import annotations

import torch

import vitreg


def test_cached_views_do_not_pin_their_base() -> None:
    model = vitreg.load("timm:vit_small_patch16_224", pretrained=False, img_size=32, depth=2)
    x = torch.randn(2, 3, 32, 32)
    names = ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_q"]

    def cls_row(t: torch.Tensor, hook: vitreg.HookContext) -> torch.Tensor:
        return t[:, :, hook.layout.cls] if hook.name.endswith("hook_pattern") else t

    _, cache = model.run_with_cache(x, names=names, reduce=cls_row)
    row, q = cache["blocks.1.attn.hook_pattern"], cache["blocks.0.attn.hook_q"]
    assert row.shape == (2, 6, 1, 5) and q.shape == (2, 5, 6, 64)
    for t in (row, q):
        assert t.untyped_storage().nbytes() == t.nbytes
    _, full = model.run_with_cache(x, names=names[0])
    torch.testing.assert_close(row, full["blocks.1.attn.hook_pattern"][:, :, :1])
