"""``vitreg.load(spec)``: one entry point for every model source (``vitreg.wrap(module)`` for a
module you already have lives in :mod:`vitreg.models.wrapping`).

Specs: ``timm:NAME[.tag]``, ``hf:ORG/NAME``, ``open_clip:ARCH/TAG``, ``local:DIR``,
``planted:NAME``, ``hf-vlm:ORG/NAME`` (a LLaVA model's vision tower; the VLM is ``model.vlm``).
Each source has a loader in the registry :data:`LOADERS`; a loader returns the source module
and, where the source defines one, its preprocessing transform.
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

from vitreg.core.containment import check_inside
from vitreg.core.registry import Registry
from vitreg.core.weights import check_weights_file
from vitreg.device import check_device
from vitreg.errors import InputError, SpecError, WeightsError, brief
from vitreg.models.input_size import check_built_size, check_grid, check_requested_size
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
    # where the weights come from (a key of WEIGHT_KINDS) when the loader knows better than
    # load() does: planted fixtures, a local: folder, a folder rather than a hub id
    weights: str | None = None


Loader = Callable[..., Loaded]
#: one loader per spec source; vitreg's own are imported on first use, higher layers register
#: theirs through :mod:`vitreg.core.plugins` (``planted:``)
LOADERS: Registry[Loader] = Registry("loaders")
for _source, _loader in {
    "timm": "vitreg.models.loaders.timm_source:load_timm",
    "hf": "vitreg.models.loaders.hf_source:load_hf",
    "hf-vlm": "vitreg.models.loaders.hf_vlm:load_hf_vlm",
    "local": "vitreg.models.loaders.local:load_local",
    "open_clip": "vitreg.models.loaders.open_clip_source:load_open_clip",
}.items():
    LOADERS.register(_source, _loader)

SPEC_EXAMPLES = {
    "timm": "timm:vit_small_patch14_reg4_dinov2.lvd142m",
    "hf": "hf:facebook/dinov2-with-registers-small",
    "open_clip": "open_clip:ViT-B-16/laion2b_s34b_b88k",
    "local": "local:./checkpoints/my_vit",
    "planted": "planted:dinov2_s14",
    "hf-vlm": "hf-vlm:llava-hf/llava-1.5-7b-hf",
}


def parse_spec(spec: str) -> tuple[str, str]:
    """Split ``'source:name'``; raise :class:`SpecError` with examples when it is malformed."""
    if not isinstance(spec, str) or ":" not in spec:
        examples = ", ".join(SPEC_EXAMPLES.values())
        raise SpecError(
            f"model spec {spec!r} needs a source prefix, e.g. {examples}. "
            "Run `vitreg models` for the supported families"
        )
    source, name = spec.split(":", 1)
    if source not in LOADERS:
        raise SpecError(
            f"unknown model source {source!r} in {spec!r}; known sources: {sorted(LOADERS)}"
        )
    if not name:
        raise SpecError(f"model spec {spec!r} names no model; e.g. {SPEC_EXAMPLES[source]}")
    return source, name


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
        "and pass the file with --weights FILE (a .safetensors file; weights=FILE in "
        "vitreg.load), or save a folder with config.json + model.safetensors and give it as "
        "local:DIR. --random-init builds the architecture with random weights (no download)."
    )


def weights_read_error(path: str | os.PathLike, e: BaseException) -> WeightsError:
    """The one-paragraph :class:`WeightsError` for a weights file that could not be read."""
    import pickle

    if isinstance(e, pickle.UnpicklingError):
        return WeightsError(
            f"weights file {str(path)!r} holds pickled Python objects besides tensors, which "
            "vitreg refuses to unpickle (unpickling can run any code; torch.load(weights_only="
            "True) stopped at them). If you trust the file, convert it once to safetensors on a "
            "machine you trust (load it, then safetensors.torch.save_file(state_dict, "
            "'model.safetensors')) and pass that file instead"
        )
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return WeightsError(
        f"could not read weights file {str(path)!r} ({type(e).__name__}: {first}). The file may "
        "be truncated or corrupt (re-download it), or not a plain state dict of tensors"
    )


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
        raise weights_read_error(p, e) from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise WeightsError(
            f"weights file {str(p)!r} holds a {type(state).__name__}, not a state dict "
            "(a mapping of parameter names to tensors)"
        )
    bad = [str(k) for k, v in state.items() if not (isinstance(k, str) and torch.is_tensor(v))]
    if bad:
        raise WeightsError(
            f"weights file {str(p)!r} is not a plain state dict of tensors: {len(bad)} entries "
            f"are not named tensors (first: {bad[:3]}); save model.state_dict() alone"
        )
    return state


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(d) for d in t.shape) + ")"


def _first(keys: list[str], n: int = 3) -> str:
    more = f" and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def head_hint(
    module: nn.Module,
    own: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    fix: Callable[[int], str],
) -> str | None:
    """What to change when the file's classifier head differs from the model's (else None)."""
    cfg = getattr(module, "pretrained_cfg", None) or {}
    names = cfg.get("classifier") or "head"
    for name in [names] if isinstance(names, str) else list(names):
        key = f"{name}.weight"
        mine, theirs = own.get(key), state.get(key)
        width = getattr(module, "num_features", None) or getattr(module, "embed_dim", None)
        if theirs is not None and theirs.ndim == 2 and (mine is None or mine.shape != theirs.shape):
            if mine is not None and mine.shape[1:] != theirs.shape[1:]:
                return None  # not a class-count difference: another width
            if mine is None and width is not None and theirs.shape[1] != width:
                return None
            n = theirs.shape[0]
            has = "has none" if mine is None else f"has a {mine.shape[0]}-class one"
            return f"the file has a {n}-class head ({key} {_shape(theirs)}) and the model {has}: {fix(n)}"
        if mine is not None and theirs is None and mine.ndim == 2:
            return (
                f"the file has no classifier head ({key}) and the model has a {mine.shape[0]}-class "
                f"one: {fix(0)} (features only)"
            )
    return None


def load_strict(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    path: str | os.PathLike,
    what: str,
    fix_head: Callable[[int], str] = lambda n: f"pass num_classes={n}",
) -> None:
    """``module.load_state_dict(state, strict=True)``; any missing or unexpected key or shape
    mismatch is a :class:`WeightsError` listing the first keys and what to change, and so are
    NaN or infinite values (naming the tensors)."""
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} keys of the model are not in the file ({_first(missing)})"
            )
        if unexpected:
            parts.append(
                f"{len(unexpected)} keys of the file are not in the model ({_first(unexpected)})"
            )
        if shapes:
            shown = "; ".join(
                f"{k}: file {_shape(state[k])}, model {_shape(own[k])}" for k in shapes[:3]
            )
            more = f" and {len(shapes) - 3} more" if len(shapes) > 3 else ""
            parts.append(f"{len(shapes)} shapes differ ({shown}{more})")
        hint = head_hint(module, own, state, fix_head)
        differ = [*missing, *unexpected, *shapes]
        if hint is None or any(k.split(".")[0] not in _heads(module) for k in differ):
            other = (
                "the file belongs to another architecture or other constructor arguments (check "
                "width, depth, patch size, registers and img_size)"
            )
            hint = f"{other}; also, {hint}" if hint else other
        raise WeightsError(
            f"the weights in {str(path)!r} do not fit {what}: " + "; ".join(parts) + f". {hint}. "
            "vitreg loads weights files strictly, so no parameter is left at its random init"
        )
    broken = [k for k, v in state.items() if v.is_floating_point() and not v.isfinite().all()]
    if broken:
        raise WeightsError(
            f"the weights in {str(path)!r} hold NaN or infinite values in {len(broken)} tensors "
            f"({_first(broken)}); trained weights have none, so the file is corrupt: re-export "
            "or re-download it"
        )
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = " ".join(str(e).split())[:300]
        raise WeightsError(f"the weights in {str(path)!r} do not fit {what}: {first}") from None


def _heads(module: nn.Module) -> set[str]:
    cfg = getattr(module, "pretrained_cfg", None) or {}
    names = cfg.get("classifier") or "head"
    return {n.split(".")[0] for n in ([names] if isinstance(names, str) else names)}


def describe_invalid(e: Any, path: str | os.PathLike, what: str) -> str:
    """One paragraph from a pydantic ``ValidationError``: the file, then per wrong field its
    dotted name, the expected value and what it holds."""
    parts = []
    for err in e.errors()[:6]:
        field_name = ".".join(str(x) for x in err["loc"]) or "the top level"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            parts.append(f"{field_name}: missing (it is required)")
            continue
        got = err.get("input")
        if isinstance(got, dict):
            parts.append(f"{field_name}: {msg}")
            continue
        parts.append(f"{field_name}: {msg[:200]} (got {brief(got, 60)})")
    more = f"; and {e.error_count() - 6} more" if e.error_count() > 6 else ""
    return f"{what} {str(path)!r} is not valid: " + "; ".join(parts) + more


def contained(folder: Path, name: str, field_name: str, config: Path) -> Path:
    """``folder/name`` if it stays inside ``folder``: a relative path without ``..`` whose
    resolved target (symlinks followed) is inside the folder's resolved path."""
    rel = Path(name)
    if rel.is_absolute() or name.startswith("~") or (rel.drive or rel.root):
        raise InputError(
            f"{str(config)!r}: {field_name} is the absolute path {name!r}; paths in a local: "
            "folder are relative to the folder and stay inside it"
        )
    if ".." in rel.parts:
        raise InputError(
            f"{str(config)!r}: {field_name} {name!r} climbs out of the folder with '..'; paths in "
            "a local: folder stay inside it"
        )
    return inside(folder, folder / rel, field_name, config)


def inside(folder: Path, target: Path, field_name: str, config: Path) -> Path:
    """``target`` if it resolves (links followed) inside ``folder`` (the one containment rule,
    :mod:`vitreg.core.containment`); the error names ``config`` and ``field_name``."""
    return check_inside(folder, target, f"{str(config)!r}: {field_name}")


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
    check_device(device)
    check_requested_size(kwargs)
    loaded = LOADERS[source](name, pretrained=pretrained, weights=weights, **kwargs)
    check_built_size(loaded.module, spec)  # before it runs (loaders with weights check earlier)
    loaded.module.eval()
    if device is not None or dtype is not None:
        loaded.module.to(device=device, dtype=dtype)
    kind = weight_kind(loaded, pretrained, weights)
    model = Model(loaded.module, spec=spec, transform=loaded.transform, weights=kind)
    check_grid(getattr(model.layout, "grid", None), spec, kwargs.get("img_size"))
    if loaded.setup is not None:
        loaded.setup(model)
    for note in loaded.notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    model.notes.extend(loaded.notes)
    return model


def weight_kind(loaded: Loaded, pretrained: bool, weights: str | os.PathLike | None) -> str:
    """Where the loaded weights come from: the loader's word, else the caller's file ("user"),
    no weights read ("random") or the source's pretrained ones ("trained")."""
    if loaded.weights is not None:
        return loaded.weights
    if getattr(loaded.module, "vitreg_weights", None) == "planted":  # planted fixtures
        return "planted"
    if weights is not None:
        return "user"
    return "trained" if pretrained else "random"
