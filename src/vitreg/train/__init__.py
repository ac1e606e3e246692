"""Training: supervised (DeiT III) and DINO/iBOT recipes, DDP, checkpoints with resume."""

from vitreg.train.config import TrainConfig
from vitreg.train.dino import DinoOptions
from vitreg.train.loop import TrainResult, train
from vitreg.train.supervised import SupervisedOptions

__all__ = ["DinoOptions", "SupervisedOptions", "TrainConfig", "TrainResult", "train"]
