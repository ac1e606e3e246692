"""The one lr schedule (training loop and linear probe) and timm's AdamW parameter groups, against
the closed forms and the grouping vitreg used before it switched to the shared helper and timm."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from vitreg.arch import create_variant
from vitreg.core.schedule import cosine, warmup_cosine
from vitreg.train.dino import DinoHead, DinoStudent
from vitreg.train.loop import param_groups

TINY = {"depth": 2, "embed_dim": 64, "num_heads": 2, "patch_size": 8, "img_size": 32}


def old_train_lr(step: int, total: int, peak: float, warmup: int, final: float) -> float:
    """The training loop's closed form: peak·(step+1)/warmup, then cosine over the rest."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(step - warmup, total - warmup) / max(total - warmup, 1)
    return final + 0.5 * (peak - final) * (1 + math.cos(math.pi * t))


def old_probe_factor(step: int, total: int, warmup: int, cos: bool) -> float:
    """The linear probe's former private ``_schedule``."""
    if step < warmup:
        return (step + 1) / warmup
    if not cos:
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


@pytest.mark.parametrize(
    ("total", "warmup", "peak", "final"),
    [(4, 0, 1e-3, 1e-6), (4, 1, 1e-3, 1e-6), (100, 10, 5e-4, 0.0), (12500, 1250, 3e-3, 3e-6)],
)
def test_train_lr_equals_closed_form(total: int, warmup: int, peak: float, final: float) -> None:
    for step in sorted({0, 1, warmup - 1, warmup, warmup + 1, total // 2, total - 1, total}):
        if step >= 0:
            assert warmup_cosine(step, total, peak, warmup, final) == old_train_lr(
                step, total, peak, warmup, final
            )


def test_warmup_ends_at_peak_then_cosine_starts_at_peak() -> None:
    """Unlike timm's CosineLRScheduler, the last warmup step and the first cosine step are both peak."""
    lrs = [warmup_cosine(s, 20, 1e-3, 4, 1e-6) for s in range(21)]
    assert lrs[:5] == [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3]
    assert lrs[-1] == 1e-6 and all(a > b for a, b in zip(lrs[4:], lrs[5:], strict=False))


@pytest.mark.parametrize(("total", "warmup"), [(30, 0), (30, 4), (301, 45), (1, 0), (7, 7)])
@pytest.mark.parametrize("cos", [True, False])
def test_probe_factor_equals_old_schedule(total: int, warmup: int, cos: bool) -> None:
    for step in range(total):
        new = warmup_cosine(step, total, 1.0, warmup, 0.0 if cos else 1.0)
        assert new == pytest.approx(
            old_probe_factor(step, total, warmup, cos), rel=1e-12, abs=1e-15
        )


def test_cosine_momentum_endpoints() -> None:
    assert cosine(0, 10, 0.992, 1.0) == 0.992
    assert cosine(10, 10, 0.992, 1.0) == cosine(11, 10, 0.992, 1.0) == 1.0
    assert cosine(5, 10, 0.992, 1.0) == pytest.approx(0.996, abs=1e-15)


def old_param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """vitreg's hand-written grouping before timm's ``param_groups_weight_decay``."""
    skip = set()
    for prefix, sub in module.named_modules():
        if hasattr(sub, "no_weight_decay"):
            skip |= {f"{prefix}.{n}" if prefix else n for n in sub.no_weight_decay()}
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        plain = p.ndim <= 1 or name in skip or name.endswith(("token", "pos_embed"))
        (no_decay if plain else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _names(module: nn.Module, groups: list[dict]) -> list[tuple[float, list[str]]]:
    name = {id(p): n for n, p in module.named_parameters()}
    return [(g["weight_decay"], [name[id(p)] for p in g["params"]]) for g in groups]


def _variant() -> nn.Module:
    return create_variant(
        "vit_tiny_patch16_224", registers=4, attn_bias=True, init_values=1e-5, **TINY
    )


@pytest.mark.parametrize("weight_decay", [0.05, 0.0])
def test_param_groups_equal_old_grouping(weight_decay: float) -> None:
    model = _variant()
    model.blocks[0].mlp.fc1.weight.requires_grad_(False)  # frozen: in no group
    student = DinoStudent(model, DinoHead(64, 32, 64, 16))
    for module in (model, student):
        new = _names(module, param_groups(module, weight_decay))
        assert new == _names(module, old_param_groups(module, weight_decay))
    decay, plain = _names(student, param_groups(student, 0.05))
    assert decay[0] == 0.05 and plain[0] == 0.0
    for n in ("backbone.blocks.1.attn.k_bias", "backbone.blocks.1.attn.v_bias", "head.prototypes"):
        assert n in decay[1]
    for n in ("mask_token", "backbone.reg_token", "backbone.cls_token", "backbone.pos_embed"):
        assert n in plain[1]
    assert "backbone.blocks.1.ls1.patch.gamma" in plain[1] and "backbone.norm.weight" in plain[1]
    assert "backbone.blocks.0.mlp.fc1.weight" not in decay[1] + plain[1]


def test_param_groups_drive_adamw() -> None:
    model = _variant()
    opt = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-3)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
