"""The resolved settings of one training run: defaults per recipe, validation, resume checks."""

from __future__ import annotations

import math

import torch
from pydantic import JsonValue

from vitreg.core.choices import AMP
from vitreg.core.renamed import renamed
from vitreg.errors import InputError, SpecError
from vitreg.results.train import ResolvedTrainConfig

__all__ = ["DEFAULTS", "amp_dtype", "check_batch", "check_resume", "resolve_steps"]

# base learning rate per 256 images, weight decay, gradient clipping (DeiT III / DINO defaults)
DEFAULTS = {"supervised": (2.5e-4, 0.05, None), "dino": (5e-4, 0.04, 3.0)}
# settings that may change between a checkpoint and its resume without changing the trajectory
# (``steps`` may grow with ``extend``: the schedule is then stretched on purpose; ``warmup_steps``
# follows it by default)
FREE_ON_RESUME = (
    "warmup_steps",
    "accum_steps",
    "amp",
    "checkpoint_every",
    "keep_checkpoints",
)


def check_resume(
    config: ResolvedTrainConfig, saved: dict[str, JsonValue], step: int, extend: bool = False
) -> None:
    """Raise :class:`InputError` if the checkpoint (at ``step``, its stored config ``saved``)
    was made with other settings or data than ``config``. Other total ``steps`` are refused
    unless ``extend`` (a longer schedule, stretched on purpose, that still lies ahead of the
    checkpoint)."""
    ours = config.model_dump(mode="json")
    skip = set(FREE_ON_RESUME) | ({"data"} if "data" not in saved else set())  # older runs
    if extend and ours["steps"] > step:
        skip.add("steps")
    diff = [
        f"{k}: checkpoint {saved.get(k)!r}, now {ours[k]!r}"
        for k in ours
        if k not in skip and saved.get(k) != ours[k]
    ]
    if diff:
        longer = ours["steps"] > step and saved.get("steps") != ours["steps"]
        hint = f", --extend to continue the schedule to {ours['steps']} steps" * longer
        raise InputError(
            f"cannot resume: the checkpoint at step {step} in this directory was made with "
            "other settings or data (" + "; ".join(diff) + f"). Use the same settings{hint}, "
            "another --out, or --no-resume to start over"
        )


def resolve_steps(steps: int | None, epochs: float | None, n: int, batch_size: int) -> int:
    """Optimizer steps from ``steps`` or ``epochs`` (exactly one of them)."""
    if (steps is None) == (epochs is None):
        raise SpecError("give exactly one of steps and epochs (--steps N or --epochs E)")
    total = steps if steps is not None else math.ceil(epochs * n / batch_size)
    if total < 1:
        raise SpecError(f"training needs at least one step, got {total}")
    return int(total)


def check_batch(batch_size: int, world: int, accum_steps: int) -> None:
    """The global batch must split evenly over ranks and accumulation steps."""
    if accum_steps < 1 or batch_size < 1:
        raise SpecError("batch_size and accum_steps must be positive")
    if batch_size % (world * accum_steps):
        raise SpecError(
            f"the global batch size {batch_size} must be divisible by ranks x accumulation steps "
            f"= {world} x {accum_steps}; pick a multiple of {world * accum_steps}"
        )


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: "auto" is bf16 (or fp16) on CUDA and off on CPU, for exact CPU runs."""
    if amp not in AMP:
        raise SpecError(f"unknown amp mode {amp!r}; choose one of {', '.join(AMP)}")
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return None
    if amp == "fp16" and device.type != "cuda":
        raise SpecError("fp16 autocast needs a CUDA device; use amp='bf16' or 'off' on CPU")
    if amp == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if amp == "bf16" else torch.float16


__getattr__ = renamed(__name__, {"TrainConfig": "ResolvedTrainConfig"}, globals())
