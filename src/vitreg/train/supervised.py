"""DeiT-III-style supervised recipe: 3-Augment views and BCE on (optionally smoothed) one-hot."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitreg.results.train import SupervisedOptions
from vitreg.train.augment import normalize, three_augment, to_tensor
from vitreg.train.data import dataset_index, generator, read_sample
from vitreg.train.recipe import BatchSpec

__all__ = ["SupervisedOptions", "SupervisedRecipe"]


class SupervisedRecipe:
    """Classification with BCE over classes (DeiT III); LayerScale is the model's business."""

    name = "supervised"

    def __init__(
        self, model: nn.Module, spec: BatchSpec, num_classes: int, opts: SupervisedOptions
    ):
        self.module = model
        self.spec = spec
        self.num_classes = num_classes
        self.opts = opts

    def to(self, device: torch.device) -> SupervisedRecipe:
        self.module.to(device)
        return self

    def batch(self, step: int, positions: range) -> dict[str, torch.Tensor]:
        s = self.spec
        images, labels = [], []
        for i in positions:
            index = dataset_index(s.seed, step, i, s.batch_size, len(s.data))
            image, label = read_sample(s.data, index)
            if label is None or not 0 <= label < self.num_classes:
                raise ValueError(
                    f"sample {index} has label {label}, outside 0..{self.num_classes - 1}"
                )
            g = generator(s.seed, "aug", step, i)
            view = three_augment(to_tensor(image), s.img_size, g, jitter=self.opts.jitter)
            images.append(normalize(view, s.mean, s.std))
            labels.append(label)
        return {"images": torch.stack(images), "labels": torch.tensor(labels)}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor], step: int):
        logits = module(batch["images"]).float()
        eps = self.opts.label_smoothing
        target = (
            F.one_hot(batch["labels"], self.num_classes).float() * (1 - eps)
            + eps / self.num_classes
        )
        loss = F.binary_cross_entropy_with_logits(logits, target)
        accuracy = (logits.argmax(-1) == batch["labels"]).float().mean()
        return loss, {"accuracy": accuracy.detach()}

    def end_step(self, step: int, reduce_sum) -> dict[str, float]:
        return {}

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        return None

    def export(self) -> nn.Module:
        return self.module
