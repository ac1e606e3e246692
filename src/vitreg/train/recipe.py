"""What the loop needs from a recipe: a trainable module, batches, a loss, per-step updates."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from pydantic import BaseModel, ValidationError
from torch import nn

from vitreg.errors import SpecError

OptionsT = TypeVar("OptionsT", bound=BaseModel)

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


def parse_options(cls: type[OptionsT], options: Mapping[str, Any] | None, recipe: str) -> OptionsT:
    """A recipe's options model from ``options`` (its defaults for the rest); an unknown key or a
    value of the wrong kind is a :class:`SpecError` naming what is valid."""
    options = dict(options or {})
    names = set(cls.model_fields)
    unknown = sorted(set(options) - names)
    if unknown:
        raise SpecError(
            f"unknown option(s) {', '.join(unknown)} for the {recipe} recipe; "
            f"valid options: {', '.join(sorted(names))}"
        )
    try:
        return cls(**options)
    except ValidationError as e:
        wrong = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise SpecError(f"invalid option(s) for the {recipe} recipe: {wrong}") from None


def norm_stats(model: nn.Module) -> tuple[tuple, tuple]:
    """The model's input mean/std (timm ``pretrained_cfg``), ImageNet statistics otherwise."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))
