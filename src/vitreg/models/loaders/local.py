"""``local:DIR``: a directory with ``config.json`` and a safetensors checkpoint.

timm layout (what ``save_local`` writes and timm's hub uses): ``config.json`` with
``architecture``, optional ``model_args`` and ``pretrained_cfg``; weights in
``model.safetensors`` (or a torch state dict, read with ``weights_only=True``). A Hugging Face
directory (``config.json`` with ``model_type``) is handed to the ``hf`` loader.

A folder is untrusted input. ``config.json`` is validated (:class:`LocalConfig`) before anything
is built: JSON with no key given twice, typed fields, no constructor argument that reads files
(``checkpoint_path``, ``pretrained_cfg_overlay``, ...), and a size estimate (built on the meta
device, no memory) under :data:`MAX_PARAMS` parameters and :data:`MAX_ACTIVATION_BYTES` per
image. Every path the folder names (weights, the neuron set of a saved fix) resolves inside the
folder. Weights are loaded strictly; ``pretrained=False`` reads no weights file at all.

Keys that higher layers handle (a saved fix's ``vitreg_fix``, which :mod:`vitreg.fix.saved`
registers) are validated and applied through :data:`SECTIONS`, so this loader knows nothing of
them.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from torch import nn

from vitreg.core.containment import check_folder
from vitreg.core.disk import writing
from vitreg.core.io import write_bytes_atomic, write_text_atomic
from vitreg.core.readers import read_json
from vitreg.core.registry import Registry
from vitreg.core.weights import WeightKind
from vitreg.errors import InputError, SpecError, VitregError, WeightsError
from vitreg.models.input_size import MAX_IMG_SIZE, activation_excess
from vitreg.models.load import (
    LOADERS,
    Loaded,
    describe_invalid,
    inside,
)
from vitreg.models.model import weights_of

WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.pth",
    "open_clip_model.safetensors",
)

#: the most parameters (and buffers) a ``local:`` config may ask for: 16 GiB in float32; the
#: largest ViTs vitreg supports have about 2 billion
MAX_PARAMS = 4_000_000_000

#: constructor arguments a folder may not set, and why
REFUSED_ARGS = {
    "checkpoint_path": "it makes timm load weights from any path on the machine",
    "pretrained": "whether weights are read is the caller's choice (pretrained=, --random-init)",
    "pretrained_cfg": "it can name a weights file or URL for timm to read",
    "pretrained_cfg_overlay": "it can name a weights file (file=...) or URL for timm to read",
    "pretrained_strict": "weights from a folder are always loaded strictly",
    "cache_dir": "it points timm at another folder to read weights from",
    "model_name": "the architecture is config.json's 'architecture'",
}
#: integer constructor arguments checked before any build: (lowest, highest)
INT_ARGS = {
    "depth": (1, 256),
    "embed_dim": (1, 32768),
    "num_heads": (1, 1024),
    "num_classes": (0, 1_000_000),
    "reg_tokens": (0, 1024),
    "in_chans": (1, 64),
}
SIZE_ARGS = ("img_size", "patch_size")


def _json_value(value: Any, where: str, depth: int = 0) -> None:
    """Raise ValueError unless ``value`` is a JSON scalar or a (nested) list of them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be finite")
    if value is None or isinstance(value, (str, int, float, bool)):
        return
    if isinstance(value, list) and depth < 4 and len(value) <= 1024:
        for v in value:
            _json_value(v, where, depth + 1)
        return
    raise ValueError(
        f"{where} must be a number, string, boolean, null or a short list of them, not a "
        f"{type(value).__name__}"
    )


def _int(value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer from {lo} to {hi}")
    if not lo <= value <= hi:
        raise ValueError(f"expected an integer from {lo} to {hi}")
    return value


def _numbers(value: Any, n: int, positive: bool = False) -> list[float]:
    ok = (
        isinstance(value, list)
        and len(value) == n
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        and all(abs(v) < 1e300 and math.isfinite(v) and (v > 0 or not positive) for v in value)
    )
    if not ok:
        kind = "positive finite numbers" if positive else "finite numbers"
        raise ValueError(f"expected a list of {n} {kind}, one per colour channel")
    return value


class ModelArgs(BaseModel):
    """``model_args``: timm constructor arguments as JSON values; none that reads a file.

    The arguments that read files are refused by name; the size arguments are typed and bounded
    (:data:`INT_ARGS`, ``img_size``/``patch_size`` up to :data:`MAX_IMG_SIZE`, ``mlp_ratio``);
    any other argument is passed to timm, which names it if it does not exist."""

    model_config = ConfigDict(extra="allow")

    checkpoint_path: Any = None
    pretrained: Any = None
    pretrained_cfg: Any = None
    pretrained_cfg_overlay: Any = None
    pretrained_strict: Any = None
    cache_dir: Any = None
    model_name: Any = None
    depth: Any = None
    embed_dim: Any = None
    num_heads: Any = None
    num_classes: Any = None
    reg_tokens: Any = None
    in_chans: Any = None
    img_size: Any = None
    patch_size: Any = None
    mlp_ratio: Any = None
    class_token: Any = None

    @model_validator(mode="before")
    @classmethod
    def _object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(
                "expected an object of timm constructor arguments, e.g. "
                '{"img_size": 224, "depth": 12}'
            )
        for key, value in data.items():
            _json_value(value, key)
        return data

    @field_validator(*REFUSED_ARGS, mode="before")
    @classmethod
    def _refused(cls, v: Any, info: ValidationInfo) -> Any:
        raise ValueError(f"refused: {REFUSED_ARGS[info.field_name]}; remove it")

    @field_validator(*INT_ARGS, mode="before")
    @classmethod
    def _ints(cls, v: Any, info: ValidationInfo) -> Any:
        return _int(v, *INT_ARGS[info.field_name])

    @field_validator(*SIZE_ARGS, mode="before")
    @classmethod
    def _sizes(cls, v: Any) -> Any:
        pair = v if isinstance(v, list) else [v]
        if len(pair) not in (1, 2):
            raise ValueError("expected an integer or a list [height, width]")
        for x in pair:
            _int(x, 1, MAX_IMG_SIZE)
        return v

    @field_validator("mlp_ratio", mode="before")
    @classmethod
    def _ratio(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 64:
            raise ValueError("expected a number above 0 and at most 64")
        return v

    @field_validator("class_token", mode="before")
    @classmethod
    def _flag(cls, v: Any) -> Any:
        if not isinstance(v, bool):
            raise ValueError("expected true or false")
        return v


class PretrainedCfg(BaseModel):
    """``pretrained_cfg``: preprocessing metadata (mean/std, input size, crop); JSON values."""

    model_config = ConfigDict(extra="allow")

    mean: list[float] | None = None
    std: list[float] | None = None
    input_size: list[int] | None = None
    crop_pct: float | None = None
    interpolation: str | None = None
    crop_mode: str | None = None
    num_classes: int | None = None
    architecture: str | None = None
    classifier: str | list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError('expected an object, e.g. {"mean": [0.5, 0.5, 0.5], ...}')
        for key, value in data.items():
            _json_value(value, key)
        return data

    @field_validator("mean", mode="before")
    @classmethod
    def _mean(cls, v: Any) -> Any:
        return _numbers(v, 3)

    @field_validator("std", mode="before")
    @classmethod
    def _std(cls, v: Any) -> Any:
        return _numbers(v, 3, positive=True)

    @field_validator("input_size", mode="before")
    @classmethod
    def _input_size(cls, v: Any) -> Any:
        ok = isinstance(v, list) and len(v) == 3
        try:
            if ok:
                [_int(x, 1, MAX_IMG_SIZE) for x in v]
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"expected [channels, height, width], integers up to {MAX_IMG_SIZE}")
        return v

    @field_validator("crop_pct", mode="before")
    @classmethod
    def _crop(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ValueError("expected a number above 0 and at most 1")
        return v

    @field_validator("num_classes", mode="before")
    @classmethod
    def _classes(cls, v: Any) -> Any:
        return _int(v, 0, 1_000_000)

    @field_validator("interpolation", "crop_mode", "architecture", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        if not isinstance(v, str):
            raise ValueError("expected a string")
        return v

    @field_validator("classifier", mode="before")
    @classmethod
    def _classifier(cls, v: Any) -> Any:
        if isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            return v
        raise ValueError("expected a module name or a list of them")


@dataclass(frozen=True)
class ConfigSection:
    """A ``config.json`` key a higher layer handles (``fix`` registers ``vitreg_fix``).

    ``schema`` validates the key's value (errors are named ``KEY.field``); ``prepare(directory,
    config_path, value)`` runs before the model is built (so a bad section fails first) and
    returns a note for the user and the setup applied to the wrapped model.
    """

    schema: type[BaseModel]
    prepare: Callable[[Path, Path, Any], tuple[str, Callable[[Any], None]]]


#: config.json keys handled by higher layers (a saved fix), which register them through
#: :mod:`vitreg.core.plugins`: ``SECTIONS.register(key, section)``
SECTIONS: Registry[ConfigSection] = Registry("local_sections")


def _an_object(cls: type, v: Any) -> Any:
    if not isinstance(v, dict):
        raise ValueError("expected an object")
    return v


class LocalConfig(BaseModel):
    """A timm-layout ``config.json`` (other top-level keys, e.g. timm hub metadata, are kept)."""

    model_config = ConfigDict(extra="allow")

    architecture: str = Field(min_length=1, max_length=200)
    model_args: ModelArgs = Field(default_factory=ModelArgs)
    pretrained_cfg: PretrainedCfg | None = None
    # where the saved weights came from, as save_local found them (None: not recorded)
    vitreg_weights: WeightKind | None = None

    @field_validator("architecture", mode="before")
    @classmethod
    def _arch(cls, v: Any) -> Any:
        if not isinstance(v, str):
            raise ValueError("expected a timm architecture name (a string)")
        return v

    _object = field_validator("pretrained_cfg", mode="before")(_an_object)


@functools.cache
def _config_model(sections: tuple[tuple[str, ConfigSection], ...]) -> type[LocalConfig]:
    """:class:`LocalConfig` with one optional field per registered section."""
    if not sections:
        return LocalConfig
    fields: dict[str, Any] = {key: (section.schema | None, None) for key, section in sections}
    objects = field_validator(*fields, mode="before")(_an_object)
    return create_model(
        "LocalConfig", __base__=LocalConfig, __validators__={"_sections": objects}, **fields
    )


def _weights_in(directory: Path) -> Path:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return inside(directory, directory / name, "the weights file", directory)
    raise WeightsError(
        f"{str(directory)!r} holds no weights file; expected one of {list(WEIGHT_FILES)}"
    )


def _folder(name: str) -> tuple[Path, Path]:
    """The folder and its config.json, or a :class:`SpecError` saying what is there instead."""
    directory = Path(name).expanduser()
    if directory.is_file():
        raise SpecError(
            f"local:{name} is a file, not a folder: local: takes a folder with config.json and "
            "model.safetensors (for a weights file alone use vitreg.load('timm:ARCH', "
            "weights=FILE), --weights on the CLI)"
        )
    if not directory.is_dir():
        raise SpecError(f"local model directory {str(directory)!r} does not exist")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise SpecError(
            f"{str(directory)!r} has no config.json; it needs one naming the architecture, "
            'e.g. {"architecture": "vit_small_patch14_dinov2", "model_args": {"img_size": 224}}'
        )
    return directory, inside(directory, config_path, "config.json", directory)


def read_config(directory: Path, config_path: Path) -> dict[str, Any]:
    """``config.json`` as a dict (checked JSON, not yet validated)."""
    raw = read_json(config_path, "model config", max_bytes=4 * 2**20)
    if not isinstance(raw, dict):
        shown = "null" if raw is None else f"a {type(raw).__name__}"
        raise InputError(
            f"model config {str(config_path)!r} holds {shown}, not an object; it needs e.g. "
            '{"architecture": "vit_small_patch14_dinov2", "model_args": {"img_size": 224}}'
        )
    return raw


def load_local(
    name: str, pretrained: bool = True, weights: str | os.PathLike | None = None, **kwargs: Any
) -> Loaded:
    """Build the architecture named in ``DIR/config.json`` and load the directory's weights.

    ``pretrained=False`` (``--random-init``) reads no weights file; ``weights=FILE`` loads that
    file instead of the folder's. Every failure names the file and the field."""
    directory, config_path = _folder(name)
    raw = read_config(directory, config_path)
    if "model_type" in raw and "architecture" not in raw:
        return _load_hf(directory, config_path, raw, pretrained, weights, kwargs)
    try:
        config = _config_model(tuple(SECTIONS.items())).model_validate(raw)
    except ValidationError as e:
        raise InputError(describe_invalid(e, config_path, "model config")) from None
    import timm

    arch = config.architecture
    if not timm.is_model(arch):
        from vitreg.models.loaders.timm_source import did_you_mean

        raise InputError(
            f"model config {str(config_path)!r}: architecture {arch!r} is not a timm "
            f"architecture{did_you_mean(arch)}"
        )
    # a bad section (e.g. a saved fix's neuron set) fails before a build
    prepared = [
        section.prepare(directory, config_path, getattr(config, key))
        for key, section in SECTIONS.items()
        if getattr(config, key) is not None
    ]
    model_args = dict(raw.get("model_args") or {})
    args = {**model_args, **kwargs}
    check_size(arch, args, model_args, kwargs, config_path)
    module = _build(arch, args, model_args, kwargs, config_path)
    sized: list[str] = []
    if weights is not None or pretrained:  # --random-init / pretrained=False reads no file
        path = Path(weights) if weights is not None else _weights_in(directory)
        module, sized = _load_weights(
            module, arch, args, path, config_path, kwargs, explicit=weights is not None
        )
    if config.pretrained_cfg is not None:
        # metadata only: never a file to read, and the architecture is the one built
        dropped = ("file", "state_dict", "architecture")
        extra = {k: v for k, v in raw["pretrained_cfg"].items() if k not in dropped}
        module.pretrained_cfg = {**module.pretrained_cfg, **extra}
    kind = saved_kind(config.vitreg_weights, pretrained, weights is not None)
    said = SAVED_NOTES.get(kind, []) if kind == config.vitreg_weights else []
    notes = [*said, *sized, *(note for note, _ in prepared)]
    if not prepared:
        return Loaded(module, notes=notes, weights=kind)

    def setup(model: Any) -> None:
        for _, apply in prepared:
            apply(model)

    return Loaded(module, notes=notes, setup=setup, weights=kind)


#: the note of a folder saved from a model that is not a trained ViT
SAVED_NOTES = {
    "planted": [
        "synthetic: this folder was saved from a planted model (random weights with planted "
        "register neurons). Not a trained model: use it to test tools, not to draw conclusions "
        "about real ViTs"
    ],
    "random": [
        "random weights: this folder was saved from a model with random, untrained weights; "
        "what it shows says nothing about a trained model"
    ],
}


def saved_kind(recorded: str | None, pretrained: bool, own_file: bool) -> str:
    """The weight kind of a ``local:`` load: the caller's file or the folder's ("user"), none
    read ("random"), or what the folder records when it was saved from a random or planted
    model (a recorded "trained" stays "user": the folder is the user's)."""
    if own_file:
        return "user"
    if not pretrained:
        return "random"
    return recorded if recorded in ("random", "planted") else "user"


def _load_weights(
    module: nn.Module,
    arch: str,
    args: dict,
    path: Path,
    config_path: Path,
    kwargs: dict,
    explicit: bool,
) -> tuple[nn.Module, list[str]]:
    """Load ``path`` into ``module``, first rebuilt at the file's input size when neither
    config.json nor the caller names one; the module and the notes on size and resampling."""
    from vitreg.models.load import read_state_dict
    from vitreg.models.loaders.timm_source import load_timm_weights, size_from_weights

    def fix_head(n: int) -> str:
        if "num_classes" in kwargs or explicit:
            return f"pass num_classes={n}"
        return f"set model_args.num_classes to {n} in {str(config_path)!r}"

    def build(**size: Any) -> nn.Module:
        return _build(arch, {**args, **size}, args, kwargs, config_path)

    state = read_state_dict(path)
    module, sized = size_from_weights(module, state, args, build, path)
    if not {"img_size", "dynamic_img_size"} & set(kwargs):  # only the caller's size resamples
        _same_grid(module, state, arch, path, config_path)
    what = f"{arch} as config.json builds it"
    return module, sized + load_timm_weights(module, arch, path, what, fix_head, state=state)


def _same_grid(module: nn.Module, state: dict, arch: str, path: Path, config_path: Path) -> None:
    """Refuse a position embedding made for another grid than the one config.json builds: a
    folder's weights must fit its own config; the caller's ``--img-size`` (the one
    way to ask for a resampled embedding, announced) skips this check."""
    from vitreg.models.loaders.timm_source import built_grid, file_grid

    grid, own = file_grid(state, module), built_grid(module)
    if grid is None or grid == own:
        return
    patch = int(module.patch_embed.patch_size[0])
    raise WeightsError(
        f"the weights in {str(path)!r} do not fit {arch} as config.json builds it: pos_embed: "
        f"file {tuple(state['pos_embed'].shape)} (a {grid[0]}x{grid[1]} grid), model "
        f"{tuple(module.pos_embed.shape)} (a {own[0]}x{own[1]} grid); set model_args.img_size "
        f"to {grid[0] * patch} in {str(config_path)!r}, or pass --img-size (img_size= in "
        "vitreg.load) to resample the position embedding to that size"
    )


def _unknown_arg(e: TypeError) -> str | None:
    m = re.search(r"keyword argument '(\w+)'", str(e))
    return m.group(1) if m else None


def _build_error(e: Exception, arch: str, model_args: dict, kwargs: dict, config_path: Path):
    """A constructor failure as an :class:`InputError` naming the config field (a TypeError
    about the caller's own keyword argument stays a TypeError)."""
    if isinstance(e, TypeError):
        key = _unknown_arg(e)
        if key is not None and key in kwargs and key not in model_args:
            return e
        if key is not None and key in model_args:
            problem = (
                f"{key!r} is set twice (timm sets it itself)"
                if "multiple values" in str(e)
                else f"{arch} takes no argument named {key!r}"
            )
            return InputError(
                f"model config {str(config_path)!r}: model_args.{key}: {problem}; remove it from "
                "model_args"
            )
    first = " ".join(str(e).split())[:200]
    return InputError(
        f"model config {str(config_path)!r}: model_args {model_args} do not build {arch} "
        f"({type(e).__name__}: {first}); check each value against timm's {arch}"
    )


def check_size(arch: str, args: dict, model_args: dict, kwargs: dict, config_path: Path) -> None:
    """Refuse a config whose model would exceed :data:`MAX_PARAMS` or whose one image would need
    more than :data:`MAX_ACTIVATION_BYTES`, estimated without allocating anything."""
    import timm
    import torch

    depth, width = args.get("depth"), args.get("embed_dim")
    ratio = args.get("mlp_ratio", 4)
    if isinstance(depth, int) and isinstance(width, int) and isinstance(ratio, (int, float)):
        _too_big(depth * width * width * (4 + 2 * ratio), arch, config_path)
    try:
        with torch.device("meta"):
            meta = timm.create_model(arch, pretrained=False, **args)
    except TypeError as e:
        raise _build_error(e, arch, model_args, kwargs, config_path) from None
    except Exception:  # some builds need real tensors: the real build below decides
        return
    n = sum(t.numel() for t in itertools.chain(meta.parameters(), meta.buffers()))
    _too_big(n, arch, config_path)
    excess = activation_excess(meta)
    if excess is not None:
        raise InputError(
            f"model config {str(config_path)!r}: img_size {args.get('img_size')} {excess}; use "
            "a smaller img_size (model_args.img_size, or --img-size)"
        )


def _too_big(n: float, arch: str, config_path: Path) -> None:
    if n > MAX_PARAMS:
        raise InputError(
            f"model config {str(config_path)!r}: model_args build {arch} with about "
            f"{n / 1e9:.1f} billion parameters ({4 * n / 2**30:.0f} GiB in float32), above the "
            f"{MAX_PARAMS / 1e9:.0f} billion vitreg builds from a local: folder (the largest "
            "ViTs have about 2); check model_args.depth, embed_dim and mlp_ratio"
        )


def _build(arch: str, args: dict, model_args: dict, kwargs: dict, config_path: Path) -> nn.Module:
    import timm

    try:
        return timm.create_model(arch, pretrained=False, **args)
    except Exception as e:
        raise _build_error(e, arch, model_args, kwargs, config_path) from None


def _load_hf(
    directory: Path,
    config_path: Path,
    raw: dict,
    pretrained: bool,
    weights: str | os.PathLike | None,
    kwargs: dict,
) -> Loaded:
    """A Hugging Face folder: its files stay inside it, then the ``hf`` loader builds it."""
    if "hf" not in LOADERS:
        raise SpecError("this is a Hugging Face directory; install vitreg[hf] to load it")
    if not isinstance(raw["model_type"], str):
        raise InputError(
            f"model config {str(config_path)!r}: model_type must be a string such as 'dinov2' "
            f"(got {raw['model_type']!r})"
        )
    check_folder(directory, "model folder")  # one containment rule
    try:
        return LOADERS["hf"](str(directory), pretrained=pretrained, weights=weights, **kwargs)
    except VitregError:
        raise
    except Exception as e:
        key = _unknown_arg(e) if isinstance(e, TypeError) else None
        if key is not None and key in kwargs:
            raise
        first = " ".join(str(e).split())[:200]
        raise InputError(
            f"model config {str(config_path)!r} does not describe a model transformers can build "
            f"({type(e).__name__}: {first}); check its fields against the model type's config"
        ) from None


def save_local(module: nn.Module, directory: str | os.PathLike, **model_args: Any) -> Path:
    """Write a timm model as ``config.json`` + ``model.safetensors`` (loadable as ``local:DIR``),
    atomically (listed in the manifest of a claimed run folder holding them)."""
    from safetensors.torch import save

    arch = getattr(module, "pretrained_cfg", {}).get("architecture")
    if not arch:
        raise SpecError("save_local needs a timm model (its pretrained_cfg names the architecture)")
    out = Path(directory)
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    write_bytes_atomic(out / "model.safetensors", save(state))
    cfg = {
        k: v
        for k, v in module.pretrained_cfg.items()
        if _jsonable(v) and k not in ("file", "state_dict")
    }
    config = {"architecture": arch, "model_args": model_args, "pretrained_cfg": cfg}
    kind = weights_of(module)
    if kind in ("random", "planted"):  # the folder keeps saying what its weights are
        config["vitreg_weights"] = kind
    write_text_atomic(out / "config.json", json.dumps(config, indent=2))
    return out


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
