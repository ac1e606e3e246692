"""``hook_name(layer, site)``: canonical block hook names, checked against the vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitreg
from _support.hook_names import PER_BLOCK, plain_vit_names
from vitreg.errors import HookError, InputError
from vitreg.hooks import BLOCK_SITES, hook_name


def test_names() -> None:
    assert hook_name(3, "hook_resid_post") == "blocks.3.hook_resid_post"
    assert hook_name(3, "mlp.hook_post") == "blocks.3.mlp.hook_post"
    assert hook_name(np.int64(2), "attn.hook_k") == "blocks.2.attn.hook_k"
    assert hook_name(torch.tensor(1), "ln1.hook_out") == "blocks.1.ln1.hook_out"
    assert vitreg.hook_name is hook_name


def test_vocabulary_is_the_pinned_block_list() -> None:
    assert BLOCK_SITES == PER_BLOCK
    names = [hook_name(i, s) for i in range(2) for s in BLOCK_SITES]
    assert names == plain_vit_names(2)[2:-1]


def test_bad_sites_and_layers() -> None:
    with pytest.raises(HookError, match="did you mean"):
        hook_name(0, "mlp.hook_pots")
    with pytest.raises(HookError, match="not a block hook site"):
        hook_name(0, "blocks.0.hook_resid_post")
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(InputError, match="block index"):
            hook_name(bad, "hook_resid_post")
