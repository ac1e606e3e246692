"""Shared by the training tests and their subprocess workers: a tiny ViT and a tiny dataset."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from vitreg.train import TrainResult, TrainSettings, train

TINY = {"depth": 2, "embed_dim": 64, "num_heads": 2, "patch_size": 8}
DINO = {"out_dim": 64, "hidden_dim": 64, "bottleneck_dim": 32, "n_local_crops": 2}


class TinyData:
    """16 random 40 px RGB images in 4 classes, as (tensor, label) pairs."""

    num_classes = 4

    def __init__(self, n: int = 16, size: int = 40, labels: bool = True):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 3, size, size, generator=g)
        self.labels = labels
        if not labels:
            self.num_classes = None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int | None]:
        return self.x[i], (i % 4 if self.labels else None)


class AtStep:
    """A Progress that calls ``fn(step)`` after every optimizer step (to interrupt a run)."""

    def __init__(self, fn: Callable[[int], None]) -> None:
        self.fn = fn

    @contextmanager
    def __call__(self, total: int | None, label: str) -> Iterator[Callable[..., None]]:
        yield lambda done, **status: self.fn(done)

    def note(self, message: str) -> None:
        return None


def run(recipe: str, out: Any, **kw: Any) -> TrainResult:
    """Train the tiny ViT (32 px, 16 patches) for a few steps with test-sized defaults."""
    args: dict[str, Any] = {
        "steps": 4,
        "batch_size": 8,
        "lr": 1e-3,
        "img_size": 32,
        "model_kwargs": TINY,
        "options": DINO if recipe == "dino" else None,
    }
    args.update(kw)
    data = args.pop("data") if "data" in args else TinyData()
    structured = {
        k: args.pop(k) for k in ("model_kwargs", "options", "progress", "label") if k in args
    }
    settings = TrainSettings(recipe=recipe, **args)
    return train("vit_tiny_patch16_224", data, settings, out, **structured)
