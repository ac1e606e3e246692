"""Checkpoints: tensors in safetensors, scalars in JSON, both written atomically; never pickle.

``checkpoints/step-00000100.safetensors`` holds the trained module (``module.*``), the recipe's
state (``recipe.*``: teacher, centres) and the optimiser's tensors (``optimizer.<i>.<key>``).
``step-00000100.json`` (written second) holds the step, the run config, the optimiser's scalar
state and param groups, the loss scaler, and the size and SHA-256 of the tensor file, so a
truncated or corrupted pair is detected; the tensor file's header repeats the step, and the JSON
carries the SHA-256 of its own other fields, so an edited sidecar (a step changed by hand) is
refused too. Augmentation and data order are pure functions of
(seed, step), and the torch RNG is reseeded from (seed, step, rank) every step, so the seed in
the config and the step are the whole RNG state.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, JsonValue

from vitreg.core.io import write_bytes_atomic, write_json_atomic
from vitreg.core.readers import read_json
from vitreg.errors import InputError, WeightsError, brief
from vitreg.models.load import read_state_dict
from vitreg.results.train import ResolvedTrainConfig

FORMAT = "vitreg-train-checkpoint"
VERSION = 2  # 2: the sidecar's own checksum and the step in the tensor file's header
FIX = "delete it to restart from the previous checkpoint, or pass --no-resume (resume=False)"


class RngScheme(BaseModel):
    """The whole RNG state of a run: its seed (every generator derives from it and the step)."""

    model_config = ConfigDict(extra="forbid")

    seed: int
    scheme: str = "derived from (seed, step, sample / rank)"


class CheckpointMeta(BaseModel):
    """The run's fields of a checkpoint sidecar (beside the file's own: format, step, tensor
    file, checksums, optimiser scalars): its config, the fp16 loss scaler, world size, RNG."""

    model_config = ConfigDict(extra="forbid")

    config: ResolvedTrainConfig
    scaler: dict[str, int | float] | None = None
    world_size: int
    rng: RngScheme


@dataclass
class Checkpoint:
    """One loaded checkpoint: its step, tensors by prefix, and JSON metadata."""

    step: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, JsonValue]
    path: Path

    def part(self, prefix: str) -> dict[str, torch.Tensor]:
        """Tensors under ``prefix.`` with the prefix removed."""
        n = len(prefix) + 1
        return {k[n:]: v for k, v in self.tensors.items() if k.startswith(prefix + ".")}


def _cpu(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{k}": v.detach().cpu().contiguous() for k, v in state.items()}


def save_checkpoint(
    folder: Path,
    step: int,
    module_state: dict[str, torch.Tensor],
    recipe_state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    meta: CheckpointMeta,
    keep: int = 2,
) -> Path:
    """Write the pair for ``step`` (tensors first, then JSON), then prune to the newest ``keep``."""
    from safetensors.torch import save

    opt = optimizer.state_dict()
    tensors = {**_cpu(module_state, "module"), **_cpu(recipe_state, "recipe")}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    blob = save(tensors, metadata={"step": str(step)})
    name = f"step-{step:08d}"
    write_bytes_atomic(folder / f"{name}.safetensors", blob)
    info = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "tensors": f"{name}.safetensors",
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "optimizer": {"param_groups": opt["param_groups"], "scalars": scalars},
        **meta.model_dump(mode="json"),
    }
    body = json.loads(json.dumps(info, default=_plain))  # exactly what the file will hold
    path = write_json_atomic(folder / f"{name}.json", {**body, "meta_sha256": _digest(body)})
    for old in sorted(folder.glob("step-*.json"))[:-keep]:
        old.with_suffix(".safetensors").unlink(missing_ok=True)
        old.unlink(missing_ok=True)
    return path


def latest_checkpoint(folder: Path) -> Path | None:
    """The JSON of the newest checkpoint in ``folder``, or None."""
    found = sorted(folder.glob("step-*.json")) if folder.is_dir() else []
    return found[-1] if found else None


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and verify a checkpoint pair; anything unreadable is a :class:`WeightsError`."""
    try:
        meta = read_json(path, "checkpoint sidecar", allow_nan=True)
        check_fields(meta)
        tensor_path = path.with_name(meta["tensors"])
        blob = tensor_path.read_bytes()
    except (OSError, InputError, ValueError) as e:
        raise WeightsError(f"checkpoint {str(path)!r} is unreadable ({e}); {FIX}") from None
    if len(blob) != meta.get("bytes") or hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        raise WeightsError(
            f"checkpoint {str(tensor_path)!r} is truncated or corrupted ({len(blob)} bytes, "
            f"expected {meta.get('bytes')}; checksum mismatch); {FIX}"
        )
    check_metadata(path, meta, blob)
    tensors = read_state_dict(tensor_path)
    return Checkpoint(step=int(meta["step"]), tensors=tensors, meta=meta, path=path)


# the sidecar fields a resume reads, and the type each must have
FIELDS: dict[str, type] = {
    "format": str,
    "tensors": str,
    "step": int,
    "bytes": int,
    "sha256": str,
    "version": int,
    "config": dict,
    "optimizer": dict,
}


def check_fields(meta: Any) -> None:
    """A sidecar is an object whose fields have their types (``step`` a whole number, ``tensors``
    a file name beside it); a ValueError naming the first wrong field otherwise."""
    if not isinstance(meta, dict):
        raise ValueError(f"it holds {brief(meta, 40)}, not an object")
    if meta.get("format") != FORMAT:
        raise ValueError(f"format is {brief(meta.get('format'), 40)}, not {FORMAT!r}")
    for key, kind in FIELDS.items():
        value = meta.get(key)
        if key == "version" and value is None:
            continue  # version-1 sidecars carry none
        if not isinstance(value, kind) or isinstance(value, bool):
            article = "an" if kind.__name__[0] in "aeiou" else "a"
            raise ValueError(f"{key} is {brief(value, 40)}, not {article} {kind.__name__}")
    if meta["step"] < 0 or meta["tensors"] != Path(meta["tensors"]).name:
        raise ValueError("step is negative or tensors is not a file name beside the sidecar")


def _plain(obj: Any) -> Any:
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def _digest(body: dict[str, Any]) -> str:
    """SHA-256 of a sidecar's fields (its own checksum left out), keys sorted."""
    fields = {k: v for k, v in body.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _header_step(blob: bytes) -> str | None:
    """The step a tensor file's safetensors header records (None when it records none)."""
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    return (header.get("__metadata__") or {}).get("step")


def check_metadata(path: Path, meta: dict[str, JsonValue], blob: bytes) -> None:
    """A version-2 sidecar must match its own checksum, and its step the tensor file's (whose
    checksum has been verified): an edited step would resume at a step never trained."""
    if meta.get("version", 1) < 2:
        return  # written before sidecars carried a checksum: the tensor checksum is all there is
    edited = meta.get("meta_sha256") != _digest(meta)
    saved = _header_step(blob)
    if edited or saved != str(meta.get("step")):
        raise WeightsError(
            f"checkpoint {str(path)!r} does not match its checksum: the sidecar says step "
            f"{meta.get('step')!r}, the verified tensor file was saved at step {saved}"
            + (" and the sidecar's fields were edited" if edited else "")
            + f"; {FIX}"
        )


def optimizer_state(ckpt: Checkpoint) -> dict[str, Any]:
    """The optimiser ``state_dict`` rebuilt from a checkpoint's tensors and JSON scalars."""
    opt = ckpt.meta["optimizer"]
    state: dict[int, dict[str, Any]] = {}
    for key, value in ckpt.part("optimizer").items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    for idx, values in opt["scalars"].items():
        state.setdefault(int(idx), {}).update(values)
    groups = [
        {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
        for g in opt["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def load_into(
    ckpt: Checkpoint, module: torch.nn.Module, optimizer: torch.optim.Optimizer, recipe: Any
) -> None:
    """Restore module, optimiser and recipe state; a shape or key mismatch is a WeightsError."""
    try:
        module.load_state_dict(ckpt.part("module"))
        recipe.load_extra_state(ckpt.part("recipe"))
        optimizer.load_state_dict(optimizer_state(ckpt))
    except (RuntimeError, KeyError, ValueError) as e:
        first = str(e).strip().splitlines()[0]
        raise WeightsError(
            f"checkpoint {str(ckpt.path)!r} does not fit this model or recipe ({first}); "
            "train with the same model and options, or pass --no-resume / another --out"
        ) from None
