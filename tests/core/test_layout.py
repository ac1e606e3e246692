import pytest
import torch

from vitreg import InputError, TokenLayout


def test_slices_follow_cls_registers_extra_patches_order():
    lay = TokenLayout(n_cls=1, n_reg=4, grid=(3, 2), patch_size=(14, 14), n_extra=2)
    assert lay.n_prefix == 7 and lay.n_tokens == 13 and lay.n_source_prefix == 5
    assert (lay.cls, lay.registers, lay.extra, lay.patches) == (
        slice(0, 1),
        slice(1, 5),
        slice(5, 7),
        slice(7, 13),
    )
    assert lay.token_types() == ["cls"] + ["register"] * 4 + ["extra"] * 2 + ["patch"] * 6


def test_no_cls_layout_starts_with_patches():
    lay = TokenLayout(0, 0, (2, 2), (16, 16))
    x = torch.arange(4).view(1, 4, 1).float()
    assert lay.take(x, "cls").shape[1] == 0
    assert torch.equal(lay.take(x, "patches"), x)


def test_patch_grid_is_row_major_and_drops_prefix():
    lay = TokenLayout(1, 1, (2, 3), (16, 16), n_extra=1)
    x = torch.arange(lay.n_tokens).view(1, -1, 1).float()
    grid = lay.patch_grid(x)
    assert grid.shape == (1, 2, 3, 1)
    assert grid[0, 1, 0, 0] == 3 + 3  # first patch of row 1 sits after 3 prefix + 3 patches


def test_strip_extra_keeps_source_tokens_in_order():
    lay = TokenLayout(1, 2, (1, 2), (8, 8), n_extra=2)
    x = torch.arange(lay.n_tokens).view(1, -1)
    assert lay.strip_extra(x).tolist() == [[0, 1, 2, 5, 6]]
    assert lay.with_extra(0).strip_extra(x[:, :5]).shape == (1, 5)


def test_wrong_token_count_is_a_clear_error():
    lay = TokenLayout(1, 0, (2, 2), (16, 16))
    with pytest.raises(InputError, match="expected 5 tokens"):
        lay.patch_grid(torch.zeros(1, 7, 3))


def test_invalid_counts_rejected():
    with pytest.raises(ValueError):
        TokenLayout(-1, 0, (2, 2), (16, 16))


def test_patch_grid_passes_stage_grids_through():
    lay = TokenLayout(0, 0, (2, 3), (8, 8))
    grid = torch.randn(1, 2, 3, 5)
    assert lay.patch_grid(grid) is grid
    assert torch.equal(lay.patch_grid(grid.flatten(1, 2)), grid)


def test_cls_index_and_token():
    lay = TokenLayout(1, 2, (1, 2), (8, 8), n_extra=1)
    x = torch.arange(2 * lay.n_tokens * 3).view(2, lay.n_tokens, 3)
    assert lay.cls_index == 0
    assert torch.equal(lay.cls_token(x), x[:, 0])
    assert torch.equal(lay.cls_token(x.transpose(1, 2), dim=2), x[:, 0])
    with pytest.raises(ValueError, match="no \\[CLS\\]"):
        _ = TokenLayout(0, 0, (2, 2), (8, 8)).cls_index
    with pytest.raises(InputError, match="expected 6 tokens"):
        lay.cls_token(x[:, :5])


def test_insert_goes_after_the_prefix_and_strip_extra_undoes_it():
    lay = TokenLayout(1, 1, (1, 3), (8, 8), n_extra=1)
    x = torch.arange(lay.n_tokens).view(1, -1, 1).float()
    new = torch.full((1, 2, 1), -1.0)
    out = lay.insert(x, new)
    assert out[0, :, 0].tolist() == [0, 1, 2, -1, -1, 3, 4, 5]
    grown = lay.with_extra(lay.n_extra + 2)
    assert grown.take(out, "extra")[0, :, 0].tolist() == [2, -1, -1]
    assert grown.strip_extra(out)[0, :, 0].tolist() == [0, 1, 3, 4, 5]
    with pytest.raises(InputError):
        lay.insert(x[:, 1:], new)
