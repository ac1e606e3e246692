"""Batched linear-probe trainer: learns what is there, nothing when nothing is, and batching the
learning rates changes no head's result."""

import math

import pytest
import torch

from vitreg.errors import InputError
from vitreg.probe.linear import (
    DINOV2_LRS,
    BatchedOptimizer,
    FitSettings,
    fit_dense,
    fit_linear,
    fit_seeds,
)
from vitreg.probe.metrics import miou

C, D = 10, 32


pytestmark = pytest.mark.usefixtures("one_thread")


def blobs(n: int, seed: int, noise_labels: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian clusters around fixed class centres (linearly separable); a ``noise_labels``
    share of the labels is replaced by random ones (1.0 = pure noise)."""
    centres = torch.randn(C, D, generator=torch.Generator().manual_seed(123)) * 3
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    x = centres[y] + torch.randn(n, D, generator=g)
    flip = torch.rand(n, generator=g) < noise_labels
    return x, torch.where(flip, torch.randint(0, C, (n,), generator=g), y)


CFG = FitSettings(lrs=(1e-3, 1e-2, 1e-1), epochs=8, batch_size=128, patience=3)


def test_default_grid_is_dinov2_series() -> None:
    assert len(DINOV2_LRS) == 13
    assert DINOV2_LRS[0] == pytest.approx(1e-5) and DINOV2_LRS[-1] == pytest.approx(0.1)
    assert all(b > a for a, b in zip(DINOV2_LRS, DINOV2_LRS[1:], strict=False))


def test_separable_data_reaches_full_accuracy() -> None:
    x, y = blobs(800, 0)
    xt, yt = blobs(1000, 1)
    x[:, 0] *= 1000  # a badly scaled feature: standardisation copes, the folded head still applies
    xt[:, 0] *= 1000
    result = fit_linear(x, y, "ce", out_dim=C, config=CFG)
    assert (result.predict(xt) == yt).float().mean() > 0.98
    assert result.lr in CFG.lrs and len(result.heads) == 3 and len(result.scores) == 3


def test_noise_labels_stay_at_chance() -> None:
    x, y = blobs(800, 0, noise_labels=1.0)
    xt, yt = blobs(3000, 1, noise_labels=1.0)
    result = fit_linear(x, y, "ce", out_dim=C, config=CFG)
    acc = (result.predict(xt) == yt).float().mean().item()
    assert abs(acc - 1 / C) < 0.04


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_batched_heads_equal_single_head_runs(optimizer: str) -> None:
    x, y = blobs(300, 2, noise_labels=0.5)  # large lrs overfit and stop, small ones keep going
    base = dict(epochs=8, batch_size=32, patience=2, weight_decay=1e-2, warmup_epochs=1)
    lrs = (1e-3, 3e-2, 1.0)
    batched = fit_linear(
        x, y, "ce", out_dim=C, config=FitSettings(lrs=lrs, optimizer=optimizer, **base)
    )
    for i, lr in enumerate(lrs):
        single = fit_linear(
            x, y, "ce", out_dim=C, config=FitSettings(lrs=(lr,), optimizer=optimizer, **base)
        )
        torch.testing.assert_close(
            batched.heads[i].weight, single.heads[0].weight, rtol=1e-4, atol=1e-5
        )
        torch.testing.assert_close(
            batched.heads[i].bias, single.heads[0].bias, rtol=1e-4, atol=1e-5
        )
        assert batched.epochs_run[i] == single.epochs_run[0]
        assert batched.best_epochs[i] == single.best_epochs[0]
        assert batched.scores[i] == pytest.approx(single.scores[0])
    assert len(set(batched.epochs_run)) > 1 or len(set(batched.best_epochs)) > 1


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_batched_optimizer_matches_torch_optim(kind: str) -> None:
    g = torch.Generator().manual_seed(0)
    lrs = torch.tensor([1e-3, 1e-2, 1e-1])
    W = torch.randn(3, 4, 5, generator=g)
    refs = [torch.nn.Parameter(W[i].clone()) for i in range(3)]
    make = torch.optim.AdamW if kind == "adamw" else torch.optim.SGD
    extra = {"momentum": 0.9} if kind == "sgd" else {}
    opts = [make([p], lr=float(lrs[i]), weight_decay=0.05, **extra) for i, p in enumerate(refs)]
    ours = BatchedOptimizer([W], kind, weight_decay=(0.05,), momentum=0.9)
    for _ in range(5):
        grad = torch.randn(3, 4, 5, generator=g)
        ours.step([grad], lrs)
        for i, (p, opt) in enumerate(zip(refs, opts, strict=True)):
            p.grad = grad[i].clone()
            opt.step()
    for i, p in enumerate(refs):
        torch.testing.assert_close(W[i], p.detach(), rtol=1e-5, atol=1e-6)


def test_early_stopping_triggers_on_noise() -> None:
    x, y = blobs(400, 3, noise_labels=1.0)
    cfg = FitSettings(lrs=(1e-1, 1.0), epochs=40, batch_size=64, patience=2, optimizer="sgd")
    result = fit_linear(x, y, "ce", out_dim=C, config=cfg)
    assert all(e < 40 for e in result.epochs_run)
    assert result.epochs_run == [b + 2 for b in result.best_epochs]


def test_external_val_selects_lr() -> None:
    x, y = blobs(300, 4)
    xv, yv = blobs(200, 5)
    cfg = FitSettings(lrs=(1e-6, 1e-2), epochs=3, batch_size=64, val_fraction=0.0)
    result = fit_linear(x, y, "ce", out_dim=C, config=cfg, val=(xv, yv))
    assert result.lr == 1e-2 and result.epochs_run == [3, 3]


def test_position_loss_recovers_grid_index() -> None:
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 12, (600,), generator=g)
    x = torch.nn.functional.one_hot(pos, 12).float() + 0.1 * torch.randn(600, 12, generator=g)
    cfg = FitSettings(lrs=(1e-2, 1e-1), epochs=10, batch_size=64)
    result = fit_linear(x, pos, "position", grid=(3, 4), config=cfg)
    assert result.head.weight.shape == (12, 14)  # 12 position classes + (row, col)
    assert (result.predict(x) == pos).float().mean() > 0.99
    coords = result.head.logits(x)[:, 12:]
    err = (coords - result.head.loss.coords(pos)).abs().mean()
    assert err < 0.4 * (0.5 - result.head.loss.coords(pos)).abs().mean()  # vs predicting the centre


def planted_dense(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Patch features on a 4×4 grid whose first 3 dims one-hot the class; labels at 16×16."""
    g = torch.Generator().manual_seed(seed)
    lab = torch.randint(0, 3, (n, 4, 4), generator=g)
    x = torch.nn.functional.one_hot(lab, 3).float() + 0.1 * torch.randn(n, 4, 4, 3, generator=g)
    x = torch.cat([x, torch.randn(n, 4, 4, 5, generator=g)], -1)
    return x, lab.repeat_interleave(4, 1).repeat_interleave(4, 2)


def test_dense_segmentation_upsamples_and_ignores() -> None:
    x, target = planted_dense(24, 0)
    target[:, :2, :] = 255  # ignored pixels must not hurt
    cfg = FitSettings(lrs=(1e-2, 1e-1), epochs=6, dense_batch_size=4, val_fraction=0.2)
    result = fit_dense(x, target, "ce", out_dim=3, config=cfg)  # ignore_index 255 by default
    xt, tt = planted_dense(8, 1)
    pred = result.predict_dense(xt, (16, 16))
    assert pred.shape == (8, 16, 16) and result.head.loss.ignore_index == 255
    assert result.head.logits_dense(xt, (16, 16)).shape == (8, 3, 16, 16)
    assert miou(pred, tt, 3) > 0.8


def test_dense_depth_heads_ignore_invalid_pixels() -> None:
    x, lab = planted_dense(24, 2)
    depth = lab.float() + 1.0
    depth[:, 0, :] = float("nan")
    depth[:, 1, :] = 0.0  # invalid for depth_bins (needs > 0); mse only skips NaN
    depth_nan = depth.clone()
    depth_nan[:, 1, :] = float("nan")
    cfg = FitSettings(lrs=(1e-2, 1e-1), epochs=8, dense_batch_size=4, val_fraction=0.2)
    xt, lt = planted_dense(8, 3)
    gt = lt.float() + 1.0
    reg = fit_dense(x, depth_nan, "mse", config=cfg)
    bins = fit_dense(x, depth, "depth_bins", min_depth=0.5, max_depth=4.0, config=cfg)
    for result in (reg, bins):
        pred = result.head.predict_dense(xt, (16, 16))
        assert pred.shape == (8, 16, 16) and torch.isfinite(pred).all()
        inner = (pred - gt)[:, 2:-2, 2:-2]  # image border aside
        assert inner.abs().median() < 0.35
    assert bins.head.weight.shape[1] == 256


def test_fit_seeds_and_ci() -> None:
    x, y = blobs(300, 6)
    xt, yt = blobs(300, 7)
    cfg = FitSettings(lrs=(1e-2,), epochs=3, batch_size=64, seeds=(0, 1, 2))
    runs = fit_seeds(
        x, y, "ce", lambda r: {"top1": (r.predict(xt) == yt).float().mean()}, out_dim=C, config=cfg
    )
    assert runs.seeds == [0, 1, 2] and len(runs.values["top1"]) == 3
    summary = runs.summary()["top1"]
    assert summary.higher_is_better is True and summary.mean > 0.9
    assert summary.ci >= 0 and not math.isnan(summary.ci)


def test_bad_loss_arguments_are_input_errors() -> None:
    x, y = blobs(50, 0)
    with pytest.raises(InputError, match="unknown probe loss"):
        fit_linear(x, y, "hinge")
    with pytest.raises(InputError, match="out_dim"):
        fit_linear(x, y, "ce")
    with pytest.raises(InputError, match="grid"):
        fit_linear(x, y, "position")
    with pytest.raises(InputError, match="fit_dense wants"):
        fit_dense(x, y, "ce", out_dim=C)
