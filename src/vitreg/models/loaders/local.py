"""``local:DIR``: a directory with ``config.json`` and a safetensors checkpoint.

timm layout (what ``save_local`` writes and timm's hub uses): ``config.json`` with
``architecture``, optional ``model_args`` and ``pretrained_cfg``; weights in
``model.safetensors`` (or a torch state dict, read with ``weights_only=True``). A Hugging Face
directory (``config.json`` with ``model_type``) is handed to the ``hf`` loader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from vitreg.errors import SpecError, WeightsError
from vitreg.models.load import LOADERS, Loaded, read_state_dict, register_loader

WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.pth",
    "open_clip_model.safetensors",
)


def _weights_in(directory: Path) -> Path:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    raise WeightsError(
        f"{str(directory)!r} holds no weights file; expected one of {list(WEIGHT_FILES)}"
    )


@register_loader("local")
def load_local(
    name: str, pretrained: bool = True, weights: str | os.PathLike | None = None, **kwargs: Any
) -> Loaded:
    """Build the architecture named in ``DIR/config.json`` and load the directory's weights."""
    directory = Path(name).expanduser()
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise SpecError(f"local model directory {str(directory)!r} does not exist")
    if not config_path.is_file():
        raise SpecError(
            f"{str(directory)!r} has no config.json; it needs one naming the architecture, "
            'e.g. {"architecture": "vit_small_patch14_dinov2", "model_args": {"img_size": 224}}'
        )
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise SpecError(f"{str(config_path)!r} is not valid JSON: {e}") from e
    if "model_type" in config and "architecture" not in config:
        if "hf" not in LOADERS:
            raise SpecError("this is a Hugging Face directory; install vitreg[hf] to load it")
        return LOADERS["hf"](str(directory), pretrained=pretrained, weights=weights, **kwargs)
    if "architecture" not in config:
        raise SpecError(f"{str(config_path)!r} names no 'architecture'")
    import timm

    arch = config["architecture"]
    if not timm.is_model(arch):
        raise SpecError(f"{str(config_path)!r} names {arch!r}, which timm does not know")
    args = {**config.get("model_args", {}), **kwargs}
    module = timm.create_model(arch, pretrained=False, **args)
    if pretrained or weights is not None:
        _load_into(module, read_state_dict(weights or _weights_in(directory)))
    if "pretrained_cfg" in config:
        module.pretrained_cfg = {**module.pretrained_cfg, **config["pretrained_cfg"]}
    fix = config.get("vitreg_fix")
    if fix is None:
        return Loaded(module)
    note = (
        f"test-time registers from {str(directory)!r} applied ({fix['n_neurons']} neurons); "
        "timm's own API loads the same weights without the fix"
    )
    return Loaded(module, notes=[note], setup=lambda model: _apply_fix(model, directory, fix))


def _apply_fix(model: Any, directory: Path, fix: dict) -> None:
    from vitreg.fix.test_time_registers import TestTimeRegisters
    from vitreg.neurons.neuron_set import NeuronSet

    neurons = NeuronSet.load(directory / fix["neurons"])
    TestTimeRegisters(neurons, **fix["options"]).apply(model)


def _load_into(module: nn.Module, state: dict) -> None:
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[:4]
        raise WeightsError(
            "the weights do not fit the architecture in config.json: " + " ".join(first)
        ) from e


def save_local(module: nn.Module, directory: str | os.PathLike, **model_args: Any) -> Path:
    """Write a timm model as ``config.json`` + ``model.safetensors`` (loadable as ``local:DIR``)."""
    from safetensors.torch import save_file

    arch = getattr(module, "pretrained_cfg", {}).get("architecture")
    if not arch:
        raise SpecError("save_local needs a timm model (its pretrained_cfg names the architecture)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    cfg = {k: v for k, v in module.pretrained_cfg.items() if _jsonable(v)}
    config = {"architecture": arch, "model_args": model_args, "pretrained_cfg": cfg}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def save_fixed(model: Any, ttr: Any, directory: str | os.PathLike, **model_args: Any) -> Path:
    """Save a timm model with its test-time-register fix; ``local:DIR`` loads it fixed.

    The weights are the untouched source weights (timm's own API loads them as the bare model);
    ``config.json`` names the neuron set and the fix options, which vitreg re-applies on load.
    """
    out = save_local(model.module, directory, **model_args)
    ttr.neurons.save(out / "neurons")
    options = {
        k: ttr.describe()[k] for k in ("n_registers", "cls", "patches", "mode", "seed", "scale")
    }
    config = json.loads((out / "config.json").read_text())
    config["vitreg_fix"] = {
        "method": "test_time_registers",
        "neurons": "neurons",
        "n_neurons": len(ttr.neurons),
        "options": options,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
    except TypeError:
        return False
    return True
