"""The variant grid and the size presets of ``vitreg experiment variants``.

Grid: {baseline, +norm/LS, +early QKV} x {no high-norm handling, registers, attention bias}, plus
the GAP baseline (average pooling, no [CLS]) and, optionally, full fine-tuning of a timm model
as is and converted to the +early-QKV variant. Every entry shares one base architecture, seed,
recipe and step count, so the entries differ only in the options named here.
"""

from __future__ import annotations

from typing import Any

from vitreg.core.renamed import renamed
from vitreg.errors import SpecError
from vitreg.results.experiment import ExperimentSettings, Variant

SPECIALISATIONS: dict[str, tuple[str, ...]] = {
    "baseline": (),
    "norm_ls": ("norm", "ls"),
    "qkv": ("norm", "ls", "qkv"),
}
SPECIALISATION_TITLES = {
    "baseline": "baseline",
    "norm_ls": "+norm/LS",
    "qkv": "+early QKV",
    "gap": "GAP (no [CLS])",
    "finetune": "fine-tuned",
}
HANDLING_TITLES = {"none": "none", "registers": "registers", "attn_bias": "attention bias"}
BASE = "vit_tiny_patch16_224"  # only its name is used: the size preset sets every dimension


def grid(registers: int = 4, include_gap: bool = True) -> list[Variant]:
    """The 9 specialisation x high-norm-handling entries, then the GAP baseline."""
    handling = {"none": {}, "registers": {"registers": registers}, "attn_bias": {"attn_bias": True}}
    out = [
        Variant(
            name=f"{spec}-{h}",
            options={"specialize": comps, **extra},
            specialisation=spec,
            handling=h,
        )
        for spec, comps in SPECIALISATIONS.items()
        for h, extra in handling.items()
    ]
    if include_gap:
        gap = {"specialize": (), "pool": "avg"}
        out.append(Variant(name="gap-none", options=gap, specialisation="gap", handling="none"))
    return out


def finetune_variants(name: str) -> list[Variant]:
    """The fine-tuning pair: the timm model ``name`` as is, and converted to +early QKV."""
    return [
        Variant(
            name=f"finetune-{spec}",
            options={"specialize": SPECIALISATIONS[spec]},
            specialisation="finetune",
            handling="none",
            finetune=name,
        )
        for spec in ("baseline", "qkv")
    ]


SIZES: dict[str, ExperimentSettings] = {
    # 2-core CPU: about a minute per variant (measured in the report's timing block)
    "tiny": ExperimentSettings(),
    # a GPU or a patient CPU: wider model, bigger images, ten times the steps
    "small": ExperimentSettings(
        size="small",
        img_size=64,
        embed_dim=192,
        steps=500,
        batch_size=64,
        lr=1e-3,
        dino={"out_dim": 1024, "hidden_dim": 512, "bottleneck_dim": 128, "n_local_crops": 4},
        probe_epochs=30,
        probe_seeds=3,
        probe_lrs=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
        diagnose_images=128,
    ),
}


def preset(size: str, **overrides: Any) -> ExperimentSettings:
    """The settings of a size preset with ``overrides`` applied."""
    if size not in SIZES:
        raise SpecError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    settings = SIZES[size].with_(**overrides)
    if settings.recipe not in ("dino", "supervised"):
        raise SpecError(f"unknown recipe {settings.recipe!r}; choose dino or supervised")
    if settings.seeds < 1 or settings.steps < 1:
        raise SpecError("--seeds and --steps must be at least 1")
    return settings


__getattr__ = renamed(__name__, {"Settings": "ExperimentSettings"}, globals())
