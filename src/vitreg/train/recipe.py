"""What the loop needs from a recipe: a trainable module, batches, a loss, per-step updates."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
from torch import nn

from vitreg.errors import SpecError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class BatchSpec:
    """Everything a recipe needs to build the batch of one step: the data and its order."""

    data: Any
    seed: int
    batch_size: int  # global, per optimizer step
    img_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


class Recipe(Protocol):
    """A training objective; the loop owns optimisation, distribution, checkpoints and logs."""

    name: str
    module: nn.Module  # what the optimiser trains (wrapped in DDP on several ranks)

    def to(self, device: torch.device) -> Recipe: ...
    def batch(self, step: int, positions: range) -> dict[str, torch.Tensor]: ...
    def loss(
        self, module: nn.Module, batch: dict[str, torch.Tensor], step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...
    def end_step(self, step: int, reduce_sum: Any) -> dict[str, float]: ...
    def extra_state(self) -> dict[str, torch.Tensor]: ...
    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None: ...
    def export(self) -> nn.Module: ...


def parse_options(cls: type, options: dict[str, Any] | None, recipe: str) -> Any:
    """Build a recipe's options dataclass; an unknown key is a :class:`SpecError` naming the valid ones."""
    options = dict(options or {})
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise SpecError(
            f"unknown option(s) {', '.join(unknown)} for the {recipe} recipe; "
            f"valid options: {', '.join(sorted(names))}"
        )
    return cls(**options)


def norm_stats(model: nn.Module) -> tuple[tuple, tuple]:
    """The model's input mean/std (timm ``pretrained_cfg``), ImageNet statistics otherwise."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))
