"""Typed run configurations, one per verb, shared by the Python API and the CLI.

Each run writes its config as ``config.yaml`` (the model's fields plus ``verb``), and
``vitreg <verb> --config config.yaml`` reads it back through the same model, so a rerun uses
exactly the same settings. Validation happens here, before any model is loaded, and every
message names the field (and the file) that is wrong.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from vitreg.analysis.rules import NAMED_THRESHOLDS
from vitreg.errors import InputError, brief
from vitreg.models.input_size import MAX_IMG_SIZE

Threshold = Literal[NAMED_THRESHOLDS] | float  # type: ignore[valid-type]  # or an absolute norm
FigureFormat = Literal["svg", "pdf"] | None  # every figure also in this format (PNG always)
FIGURE_FORMAT = Field(None, description="also write every figure as svg or pdf")
MAX_SEED = 2**32 - 1  # every RNG vitreg seeds (torch, numpy, the data order) takes it
# counts that size what a run allocates or loops over, bounded before anything runs
REGISTERS = Field(1, gt=0, le=256, description="test-time registers (the paper uses 1)")
CHECKPOINT = "save the streaming statistics every N images into RUN.resume; a rerun resumes"
BATCH = Field(32, gt=0, le=65536, description="images per forward pass")


def _weights_file(v: Path | None) -> Path | None:
    """A ``--weights`` file that exists and that vitreg reads (checked before any model loads)."""
    if v is not None:
        from vitreg.errors import VitregError
        from vitreg.models.load import check_weights_file

        try:
            check_weights_file(v)
        except VitregError as e:
            raise ValueError(str(e)) from None
    return v


def _usable_device(v: str | None) -> str | None:
    """A ``--device`` that exists on this machine and holds data (checked before any model
    loads: ``meta``, or ``cuda`` without a GPU, is an error naming the option, not a traceback)."""
    if v is not None:
        from vitreg.device import device_problem

        problem = device_problem(v)
        if problem is not None:
            raise ValueError(problem)
    return v


def _img_size(v: int | None) -> int | None:
    """An ``--img-size`` a ViT can take, checked here so that no verb allocates for it first."""
    if v is not None and not 1 <= v <= MAX_IMG_SIZE:
        raise ValueError(
            f"the input size must be a whole number of pixels from 1 to {MAX_IMG_SIZE}; ViTs "
            "take 224 or 518, or a multiple of their patch size near it"
        )
    return v


def _finite(v: float | None, name: str) -> float | None:
    if v is not None and not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v}")
    return v


class RunConfig(BaseModel):
    """Settings every verb shares: where results go."""

    model_config = ConfigDict(extra="forbid")
    verb: ClassVar[str] = ""

    out: Path | None = Field(None, description="run directory (default runs/<time>_<model>_<verb>)")
    # an action on the run directory, not a setting of the run: never in config.yaml, so that a
    # rerun with --config never replaces a run unless asked again
    overwrite: bool = Field(False, exclude=True, description="replace the run already in out")

    def to_file(self) -> dict[str, Any]:
        """What config.yaml holds: ``verb`` and every field (not ``overwrite``), JSON-typed."""
        return {"verb": self.verb, **self.model_dump(mode="json")}


class ModelImages(RunConfig):
    """A model and the images it runs on."""

    spec: str | None = Field(None, description="model spec; None: the synthetic demo")
    images: Path | None = None
    samples: bool = False
    limit: PositiveInt | None = None
    batch_size: int = BATCH
    img_size: PositiveInt | None = None
    random_init: bool = False
    weights: Path | None = Field(
        None,
        description="weights file loaded into spec: every key, strictly (a resampled position embedding is announced)",
    )
    device: str | None = None

    _weights = field_validator("weights")(_weights_file)
    _device = field_validator("device")(_usable_device)
    _size = field_validator("img_size")(_img_size)

    @model_validator(mode="after")
    def _one_source(self) -> ModelImages:
        if self.images is not None and self.samples:
            raise ValueError("images and samples exclude each other; pass one of them")
        if self.random_init and self.weights is not None:
            raise ValueError("random_init and weights exclude each other; pass one of them")
        return self


class DiagnoseConfig(ModelImages):
    verb: ClassVar[str] = "diagnose"

    checkpoint_every: PositiveInt | None = Field(None, description=CHECKPOINT)

    max_maps: int = Field(8, gt=0, le=1024)
    figure_format: FigureFormat = FIGURE_FORMAT
    models: str | None = Field(None, description="comma-separated specs to diagnose and compare")

    @model_validator(mode="after")
    def _spec_or_models(self) -> DiagnoseConfig:
        if self.spec and self.models:
            raise ValueError("pass either one spec or models A,B,C, not both")
        return self


class NeuronSearch(ModelImages):
    """How register neurons are found (shared by neurons, and by fix when it discovers first)."""

    target: float = Field(0.01, ge=0.0, le=1.0)
    top_k: Literal["auto"] | PositiveInt = "auto"
    detect_layer: int | None = None
    highest_layer: int | None = None
    threshold: Threshold = "auto"

    @field_validator("threshold")
    @classmethod
    def _positive(cls, v: Threshold) -> Threshold:
        if isinstance(v, float) and not (math.isfinite(v) and v > 0):
            raise ValueError(f"a numeric threshold must be a positive norm, got {v}")
        return v


class NeuronsConfig(NeuronSearch):
    verb: ClassVar[str] = "neurons"

    figure_format: FigureFormat = FIGURE_FORMAT
    stability: bool = Field(False, description="also choose the set on each half of the images")
    check_sizes: list[PositiveInt] = Field(
        default_factory=list, description="image sizes at which the chosen set's fix is checked too"
    )
    hub_dir: Path | None = Field(None, description="also write a hub-ready folder (set + card)")
    checkpoint_every: PositiveInt | None = Field(None, description=CHECKPOINT)

    @field_validator("check_sizes", mode="before")
    @classmethod
    def _comma_separated(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [part.strip() for part in v.split(",") if part.strip()]
        return [] if v is None else v


class FixConfig(NeuronSearch):
    verb: ClassVar[str] = "fix"

    neurons: str | None = Field(None, description="NeuronSet file, 'builtin', or None: discover")
    method: str = Field("ttr", description="fix method, a+b to compose, a,b for a leaderboard")
    probe: str | None = Field(None, description="leaderboard probe: TASK:DATA, e.g. ov-seg:voc:DIR")
    save: Path | None = None
    registers: int = REGISTERS
    cls: Literal["zero", "keep"] = "zero"
    patches: Literal["zero", "mean", "keep"] = "zero"
    mode: Literal["paper", "reference"] = "paper"
    figure_format: FigureFormat = FIGURE_FORMAT

    @field_validator("method")
    @classmethod
    def _methods(cls, v: str) -> str:
        """Known method names that compose (checked before any model loads)."""
        from vitreg.fix.methods import parse_entries

        return ",".join(parse_entries(v))

    @field_validator("probe")
    @classmethod
    def _probe(cls, v: str | None) -> str | None:
        """A known probe task and a dataset spec, split at the first colon."""
        from vitreg.probe.tasks import TASKS

        task, _, data = (v or "").partition(":")
        if v is not None and (task not in TASKS or not data):
            raise ValueError(f"give TASK:DATA with TASK one of {', '.join(sorted(TASKS))}")
        return v

    @field_validator("save")
    @classmethod
    def _save_folder(cls, v: Path | None) -> Path | None:
        """A folder to save into, checked before any model loads (not an existing file)."""
        existing = next((p for p in (v, *v.parents) if p.exists()), None) if v else None
        if existing is not None and not existing.is_dir():
            where = "is a file" if existing == v else f"lies inside {str(existing)!r}, a file"
            raise ValueError(
                f"{where}; --save writes a folder (config.json, model.safetensors, neurons.*) "
                "that local:DIR loads: pass a new folder"
            )
        return v


class VlmConfig(NeuronSearch):
    """``vitreg vlm``: a VLM's answers and language->image attention, without and with
    test-time registers on its vision tower."""

    verb: ClassVar[str] = "vlm"

    spec: str = Field(description="hf-vlm:ORG/NAME or hf-vlm:DIR (a LLaVA model)")
    prompt: str = Field(min_length=1)
    neurons: str = Field("auto", description="NeuronSet file, or 'auto': discover on the images")
    query: Literal["answer", "last"] = "answer"
    max_new_tokens: int = Field(32, gt=0, le=4096)
    registers: int = REGISTERS
    cls: Literal["zero", "keep"] = "zero"
    patches: Literal["zero", "mean", "keep"] = "zero"
    mode: Literal["paper", "reference"] = "paper"
    batch_size: int = Field(8, gt=0, le=65536)

    @field_validator("spec")
    @classmethod
    def _vlm_spec(cls, v: str) -> str:
        if not v.startswith("hf-vlm:"):
            raise ValueError("must be an hf-vlm: spec, e.g. hf-vlm:llava-hf/llava-1.5-7b-hf")
        return v

    @field_validator("neurons")
    @classmethod
    def _neurons_source(cls, v: str) -> str:
        if v != "auto" and not (Path(v).is_file() or Path(f"{v}.json").is_file()):
            raise ValueError("neither auto nor an existing NeuronSet file (neurons.json)")
        return v


class ProbeRunConfig(RunConfig):
    """``vitreg probe``: linear probes on frozen tokens, with and without test-time registers."""

    verb: ClassVar[str] = "probe"

    spec: str | None = Field(None, description="model spec; None: the synthetic demo")
    task: str = "classification"
    data: str = "synthetic-cls:n=200"
    fix: str = Field("none", description="none, both, builtin or a NeuronSet file")
    neurons: str | None = Field(None, description="with fix both: NeuronSet file or 'builtin'")
    layers: str = Field("-1", description="comma-separated blocks, 'final' or hook names")
    templates: Path | None = Field(None, description="zero-shot prompt templates file")
    cache: Path = Path(".vitreg-cache") / "features"
    seeds: int = Field(3, gt=0, le=1000)
    epochs: int = Field(30, gt=0, le=100_000)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    registers: int = REGISTERS
    batch_size: int = BATCH
    img_size: PositiveInt | None = None
    random_init: bool = False
    weights: Path | None = Field(
        None,
        description="weights file loaded into spec: every key, strictly (a resampled position embedding is announced)",
    )
    device: str | None = None
    figure_format: FigureFormat = FIGURE_FORMAT

    _weights = field_validator("weights")(_weights_file)
    _device = field_validator("device")(_usable_device)
    _size = field_validator("img_size")(_img_size)

    @model_validator(mode="after")
    def _init_or_weights(self) -> ProbeRunConfig:
        if self.random_init and self.weights is not None:
            raise ValueError("random_init and weights exclude each other; pass one of them")
        return self

    @field_validator("task")
    @classmethod
    def _known_task(cls, v: str) -> str:
        from vitreg.probe.tasks import TASKS

        if v not in TASKS:
            raise ValueError(f"not a probe task; choose from {', '.join(sorted(TASKS))}")
        return v

    @field_validator("fix")
    @classmethod
    def _fix_source(cls, v: str) -> str:
        if v not in ("none", "both", "builtin") and not Path(v).exists():
            raise ValueError(
                "neither none, both, builtin nor an existing NeuronSet file (neurons.json from "
                "`vitreg neurons`)"
            )
        return v

    @field_validator("neurons")
    @classmethod
    def _neurons_with_fix_both(cls, v: str | None, info: Any) -> str | None:
        fix = info.data.get("fix")  # absent when fix itself is wrong
        if v is not None and fix == "none":
            raise ValueError("applies to fix both only; with fix none there is no fix")
        if v is not None and fix not in (None, "both"):
            raise ValueError("give the neurons once: fix FILE, or fix both with neurons FILE")
        return v

    @field_validator("templates")
    @classmethod
    def _templates_for_zero_shot(cls, v: Path | None, info: Any) -> Path | None:
        if v is not None and info.data.get("task") not in (None, "zero-shot", "ov-seg"):
            raise ValueError("prompt templates apply to tasks zero-shot and ov-seg only")
        if v is not None and not v.is_file():
            raise ValueError("no such file (one template per line, with {} for the class name)")
        return v

    @field_validator("layers")
    @classmethod
    def _no_layers_for_model_tasks(cls, v: str, info: Any) -> str:
        from vitreg.probe.tasks import TASKS

        task = TASKS.get(info.data.get("task", ""))
        if getattr(task, "scores_model", False) and v.strip() != "-1":
            raise ValueError(
                "zero-shot scores the image embedding and attention-seg the last block's "
                "attention: these tasks take no layers"
            )
        return v

    @field_validator("layers")
    @classmethod
    def _some_layer(cls, v: str) -> str:
        if not any(p.strip() for p in v.split(",")):
            raise ValueError("names no layer; use e.g. -1 or 0,6,-1 or final")
        return v


TRAIN_RECIPES = ("supervised", "dino")  # vitreg.train.config.RECIPES
AMP_MODES = ("auto", "off", "bf16", "fp16")  # vitreg.train.config.AMP


class TrainRunConfig(RunConfig):
    """``vitreg train``: train a ViT (supervised DeiT-III or DINO/iBOT)."""

    verb: ClassVar[str] = "train"

    variant: str = Field(description="timm ViT name or vitreg variant (vitreg_*)")
    data: str
    recipe: Literal[TRAIN_RECIPES] = "supervised"  # type: ignore[valid-type]
    steps: PositiveInt | None = None
    epochs: float | None = Field(None, gt=0)
    batch_size: int = Field(64, gt=0, le=65536)
    lr: float | None = Field(None, gt=0)
    img_size: PositiveInt | None = None
    accum_steps: PositiveInt = 1
    amp: Literal[AMP_MODES] = "auto"  # type: ignore[valid-type]
    seed: int = Field(0, ge=0, le=MAX_SEED)
    checkpoint_every: PositiveInt | None = None
    resume: bool = True
    extend: bool = False
    device: str | None = None
    model_arg: list[str] | None = Field(None, description="model constructor KEY=VALUE pairs")
    option: list[str] | None = Field(None, description="recipe option KEY=VALUE pairs")

    @field_validator("epochs", "lr")
    @classmethod
    def _finite_number(cls, v: float | None, info: Any) -> float | None:
        return _finite(v, info.field_name)

    _device = field_validator("device")(_usable_device)
    _size = field_validator("img_size")(_img_size)

    @field_validator("model_arg", "option")
    @classmethod
    def _key_value(cls, v: list[str] | None, info: Any) -> list[str] | None:
        from vitreg.models.loaders.local import REFUSED_ARGS

        for pair in v or []:
            key, sep, _ = pair.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{brief(pair)} is not KEY=VALUE (e.g. depth=2)")
            if info.field_name == "model_arg" and key.strip() in REFUSED_ARGS:
                raise ValueError(f"{key.strip()} is refused: {REFUSED_ARGS[key.strip()]}")
        return v

    @model_validator(mode="after")
    def _length(self) -> TrainRunConfig:
        if self.steps is None and self.epochs is None:
            raise ValueError("pass steps or epochs (--steps N or --epochs E)")
        return self


class ExperimentConfig(RunConfig):
    """``vitreg experiment variants``: train, probe and diagnose the ViT variant grid."""

    verb: ClassVar[str] = "experiment"

    data: str = Field(description="dataset spec or image folder")
    size: str | None = Field(None, description="size preset; None: small on a GPU, else tiny")
    steps: PositiveInt | None = None
    recipe: Literal[TRAIN_RECIPES] = "dino"  # type: ignore[valid-type]
    include_gap: bool = True
    finetune: str | None = Field(None, description="also fine-tune this timm ViT")
    pretrained: bool = False
    seeds: PositiveInt | None = None
    batch_size: PositiveInt | None = None
    threads: PositiveInt | None = None
    figure_format: FigureFormat = FIGURE_FORMAT

    @field_validator("size")
    @classmethod
    def _known_size(cls, v: str | None) -> str | None:
        from vitreg.experiment.grid import SIZES

        if v is not None and v not in SIZES:
            raise ValueError(f"unknown size preset; choose one of {', '.join(SIZES)}")
        return v

    @model_validator(mode="after")
    def _pretrained_needs_finetune(self) -> ExperimentConfig:
        if self.pretrained and self.finetune is None:
            raise ValueError("pretrained applies to finetune NAME; pass both or neither")
        return self


CONFIGS: dict[str, type[RunConfig]] = {
    c.verb: c
    for c in (
        DiagnoseConfig,
        NeuronsConfig,
        FixConfig,
        ProbeRunConfig,
        TrainRunConfig,
        ExperimentConfig,
        VlmConfig,
    )
}


MAX_FIELDS = 8  # wrong fields named in one message; the count of the rest follows


def describe_errors(e: ValidationError, where: str, flags: bool = False) -> str:
    """One clause per wrong field: its name (``--flag`` form with ``flags``), what it got (cut
    to a line) and what it expects (the alternatives of a union joined by "or")."""
    fields: dict[str, tuple[Any, list[str]]] = {}
    for err in e.errors():
        loc = [str(x) for x in err["loc"]]
        name = ".".join(loc) if loc else "as a whole"
        if flags and loc:
            name = "--" + loc[0].replace("_", "-")
        got, msgs = fields.setdefault(name[:80], (err.get("input"), []))
        msg = err["msg"].removeprefix("Value error, ")[:300]
        if msg not in msgs and len(msgs) < 4:
            msgs.append(msg)
    parts = []
    for name, (got, msgs) in list(fields.items())[:MAX_FIELDS]:
        shown = "" if isinstance(got, dict) else f" (got {brief(got)})"
        parts.append(f"{name}: {' or '.join(msgs)}{shown}")
    more = len(fields) - MAX_FIELDS
    return f"{where}: " + "; ".join(parts) + (f"; and {more} more fields" if more > 0 else "")


def build_config(
    cls: type[RunConfig], values: dict[str, Any], where: str, flags: bool = False
) -> RunConfig:
    """``cls`` from ``values``, or an :class:`InputError` naming every wrong field."""
    try:
        return cls.model_validate(values)
    except ValidationError as e:
        raise InputError(describe_errors(e, where, flags)) from None


def read_config(path: str | Path, verb: str) -> dict[str, Any]:
    """The settings of ``verb`` in a config.yaml written by a run (checked, not yet validated),
    read by the one YAML reader with its size, depth and alias budgets."""
    from vitreg.core.readers import read_yaml

    p = Path(path)
    if not p.is_file():
        raise InputError(f"--config {p}: no such file (pass the config.yaml of a run)")
    raw = read_yaml(p, "--config")
    if not isinstance(raw, dict):
        raise InputError(f"--config {p} holds a {type(raw).__name__}, not a mapping of settings")
    if "overwrite" in raw:  # issue 24: replacing a run is asked on the command line only
        raise InputError(
            f"--config {p} sets overwrite; vitreg never reads overwrite from a file, so that a "
            "config cannot replace a run: remove that line and pass --overwrite on the command "
            "line to replace the run in --out"
        )
    found = raw.pop("verb", None)
    if found != verb:
        shown = found if isinstance(found, str) and found else "pre-1.1 or unknown"
        raise InputError(
            f"--config {p} is the config of a {shown[:40]} run, not of "
            f"`vitreg {verb}`; pass the config.yaml written by a {verb} run"
        )
    return raw


def load_config(path: str | Path, verb: str) -> RunConfig:
    """The typed config of ``verb`` stored at ``path`` (a run's config.yaml)."""
    return build_config(CONFIGS[verb], read_config(path, verb), f"--config {path}")
