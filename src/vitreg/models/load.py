"""``vitreg.load(spec)`` and ``vitreg.wrap(module)``: one entry point for every model source.

Specs: ``timm:NAME[.tag]``, ``hf:ORG/NAME``, ``open_clip:ARCH/TAG``, ``local:DIR``,
``planted:NAME``. Each source has a loader registered in :data:`LOADERS`; a loader returns the
source module and, where the source defines one, its preprocessing transform.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitreg.errors import SpecError, WeightsError
from vitreg.models.model import Model


@dataclass
class Loaded:
    """What a loader returns: the source module, its preprocessing (if the source defines one)
    and notes on traps the user should know about (also raised as warnings)."""

    module: nn.Module
    transform: Callable | None = None
    notes: list[str] = field(default_factory=list)
    # applied to the wrapped model before it is returned (e.g. a saved test-time-register fix)
    setup: Callable[[Model], None] | None = None


Loader = Callable[..., Loaded]
LOADERS: dict[str, Loader] = {}

SPEC_EXAMPLES = {
    "timm": "timm:vit_small_patch14_reg4_dinov2.lvd142m",
    "hf": "hf:facebook/dinov2-with-registers-small",
    "open_clip": "open_clip:ViT-B-16/laion2b_s34b_b88k",
    "local": "local:./checkpoints/my_vit",
    "planted": "planted:dinov2_s14",
}


def register_loader(source: str) -> Callable[[Loader], Loader]:
    def deco(fn: Loader) -> Loader:
        LOADERS[source] = fn
        return fn

    return deco


def parse_spec(spec: str) -> tuple[str, str]:
    """Split ``'source:name'``; raise :class:`SpecError` with examples when it is malformed."""
    if not isinstance(spec, str) or ":" not in spec:
        examples = ", ".join(SPEC_EXAMPLES.values())
        raise SpecError(
            f"model spec {spec!r} needs a source prefix, e.g. {examples}. "
            "Run `vitreg models` for the supported families"
        )
    source, name = spec.split(":", 1)
    _ensure_loaders()
    if source not in LOADERS:
        raise SpecError(
            f"unknown model source {source!r} in {spec!r}; known sources: {sorted(LOADERS)}"
        )
    if not name:
        raise SpecError(f"model spec {spec!r} names no model; e.g. {SPEC_EXAMPLES[source]}")
    return source, name


def _ensure_loaders() -> None:
    # importing these modules registers their loaders
    from vitreg.models import loaders  # noqa: F401


def offline_hint(tried: str, cause: BaseException) -> str:
    """The one-paragraph explanation for weights that could not be fetched."""
    hf_home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
    offline = os.environ.get("HF_HUB_OFFLINE", "unset")
    return (
        f"Could not fetch pretrained weights: tried {tried}. The download failed "
        f"({type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}), "
        "which usually means this machine is offline or the hub is unreachable. If the weights "
        f"are already in the Hugging Face cache (HF_HOME={hf_home}), set HF_HUB_OFFLINE=1 "
        f"(now {offline}) to use the cache only; otherwise download them on a connected machine "
        "and pass weights='/path/to/model.safetensors' to vitreg.load (--weights on the CLI), or "
        "save a directory with config.json + model.safetensors and load it as 'local:DIR'. "
        "Use pretrained=False to build the architecture with random weights."
    )


def check_weights_file(path: str | os.PathLike) -> Path:
    """A weights file must exist and be a safetensors file or a torch state dict."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise WeightsError(f"weights file {str(p)!r} does not exist; check the path")
    if p.suffix not in (".safetensors", ".pth", ".pt", ".bin"):
        raise WeightsError(
            f"weights file {str(p)!r} has suffix {p.suffix!r}; vitreg reads .safetensors "
            "(preferred) or torch state dicts (.pth/.pt/.bin, loaded with weights_only=True)"
        )
    return p


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read weights from safetensors, or ``torch.load(weights_only=True)``; never unpickle code."""
    p = check_weights_file(path)
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(p))
        else:
            state = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as e:
        raise WeightsError(
            f"could not read weights file {str(p)!r}: {type(e).__name__}: {e}. The file may be "
            "truncated or corrupt (re-download it), or not a plain state dict"
        ) from e
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{str(p)!r} does not hold a state dict of tensors")
    return state


def load(
    spec: str,
    pretrained: bool = True,
    weights: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **kwargs: Any,
) -> Model:
    """Load a ViT from ``spec`` and wrap it; extra kwargs go to the source's constructor.

    ``weights`` overrides the source's pretrained weights with a local file. Examples:
    ``load("timm:vit_small_patch14_dinov2.lvd142m", img_size=224)``,
    ``load("hf:facebook/dinov2-small")``, ``load("planted:dinov2_s14")``.
    """
    source, name = parse_spec(spec)
    if weights is not None:
        check_weights_file(weights)
    loaded = LOADERS[source](name, pretrained=pretrained, weights=weights, **kwargs)
    loaded.module.eval()
    if device is not None or dtype is not None:
        loaded.module.to(device=device, dtype=dtype)
    model = Model(loaded.module, spec=spec, transform=loaded.transform)
    if loaded.setup is not None:
        loaded.setup(model)
    for note in loaded.notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    model.notes.extend(loaded.notes)
    return model


def wrap(module: nn.Module, transform: Callable | None = None, spec: str | None = None) -> Model:
    """Adapt a model object you already have (timm, HF, open_clip vision tower)."""
    return Model(module, spec=spec, transform=transform)
