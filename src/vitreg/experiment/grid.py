"""The variant grid and the size presets of ``vitreg experiment variants``.

Grid: {baseline, +norm/LS, +early QKV} x {no high-norm handling, registers, attention bias}, plus
the GAP baseline (average pooling, no [CLS]) and, optionally, full fine-tuning of a timm model
as is and converted to the +early-QKV variant. Every entry shares one base architecture, seed,
recipe and step count, so the entries differ only in the options named here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vitreg.errors import SpecError

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


@dataclass(frozen=True)
class Variant:
    """One grid entry: a name, its ``create_variant`` options, and how it is grouped."""

    name: str
    options: dict[str, Any]
    specialisation: str  # key of SPECIALISATION_TITLES
    handling: str  # key of HANDLING_TITLES
    finetune: str | None = None  # timm model name, for the fine-tuning entries

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["options"] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in self.options.items()
        }
        return out


def grid(registers: int = 4, include_gap: bool = True) -> list[Variant]:
    """The 9 specialisation x high-norm-handling entries, then the GAP baseline."""
    handling = {"none": {}, "registers": {"registers": registers}, "attn_bias": {"attn_bias": True}}
    out = [
        Variant(f"{spec}-{h}", {"specialize": comps, **extra}, spec, h)
        for spec, comps in SPECIALISATIONS.items()
        for h, extra in handling.items()
    ]
    if include_gap:
        out.append(Variant("gap-none", {"specialize": (), "pool": "avg"}, "gap", "none"))
    return out


def finetune_variants(name: str) -> list[Variant]:
    """The fine-tuning pair: the timm model ``name`` as is, and converted to +early QKV."""
    return [
        Variant("finetune-baseline", {"specialize": ()}, "finetune", "none", finetune=name),
        Variant("finetune-qkv", {"specialize": ("norm", "ls", "qkv")}, "finetune", "none", name),
    ]


@dataclass(frozen=True)
class Settings:
    """Everything shared by the grid: architecture, training, probes and diagnosis."""

    size: str = "tiny"
    img_size: int = 48
    patch_size: int = 8
    depth: int = 6
    embed_dim: int = 96
    num_heads: int = 3
    init_values: float = 1e-5
    recipe: str = "dino"
    steps: int = 50
    batch_size: int = 32
    lr: float | None = 2e-3
    seeds: int = 1  # training seeds per variant (0..seeds-1)
    dino: dict[str, Any] = field(
        default_factory=lambda: {
            "out_dim": 256,
            "hidden_dim": 256,
            "bottleneck_dim": 64,
            "n_local_crops": 2,
            "momentum": 0.9,  # a fast EMA teacher: the exported teacher reflects 50 steps
        }
    )
    probe_epochs: int = 20
    probe_seeds: int = 1
    probe_lrs: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    diagnose_images: int = 32
    batch_eval: int = 32

    def model_kwargs(self) -> dict[str, int | float]:
        """timm constructor arguments of the shared base architecture."""
        return {
            "depth": self.depth,
            "embed_dim": self.embed_dim,
            "num_heads": self.num_heads,
            "patch_size": self.patch_size,
            "init_values": self.init_values,
        }

    def with_(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (``None`` values are ignored, so CLI defaults pass through)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["probe_lrs"] = list(self.probe_lrs)
        return out


SIZES: dict[str, Settings] = {
    # 2-core CPU: about a minute per variant (measured in the report's timing block)
    "tiny": Settings(),
    # a GPU or a patient CPU: wider model, bigger images, ten times the steps
    "small": Settings(
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


def preset(size: str, **overrides: Any) -> Settings:
    """The settings of a size preset with ``overrides`` applied."""
    if size not in SIZES:
        raise SpecError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    settings = SIZES[size].with_(**overrides)
    if settings.recipe not in ("dino", "supervised"):
        raise SpecError(f"unknown recipe {settings.recipe!r}; choose dino or supervised")
    if settings.seeds < 1 or settings.steps < 1:
        raise SpecError("--seeds and --steps must be at least 1")
    return settings
