"""Typed run configurations, one per verb, shared by the Python API and the CLI.

Each verb's config is composed of parts that several verbs share (:class:`ModelSource`,
:class:`ImageSet`, :class:`NeuronSearch`, :class:`TtrSettings`, :class:`NeuronChoice`,
:class:`Figures`, the run directory of :class:`RunConfig`; training's
:class:`~vitreg.settings.train.TrainSettings`), so a setting has one default and one description
wherever it appears; the CLI's options are generated from them (``vitreg.cli.options``).

Each run writes its config as ``config.yaml`` (the model's fields plus ``verb``), and
``vitreg <verb> --config config.yaml`` reads it back through the same model, so a rerun uses
exactly the same settings. Validation happens here, before any model is loaded, and every
message names the field (and the file) that is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    JsonValue,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from vitreg.core.choices import RECIPES
from vitreg.core.renamed import renamed
from vitreg.errors import InputError, brief
from vitreg.settings.base import (
    BATCH,
    CHECKPOINT_EVERY,
    DEFAULT_SPEC,
    FigureFormat,
    Figures,
    SettingsPart,
    Threshold,
    finite,
    valid_device,
    valid_img_size,
)
from vitreg.settings.compilation import Compilation
from vitreg.settings.model import ImageSet, ModelSource
from vitreg.settings.neurons import DISCOVER, NeuronChoice, NeuronSearch, NeuronSource
from vitreg.settings.ov_seg import OvSegProtocol
from vitreg.settings.sae import SaeSettings
from vitreg.settings.train import TrainSettings
from vitreg.settings.ttr import TtrSettings

#: every verb's config and, re-exported, the parts they compose
__all__ = [
    "CompareConfig",
    "DEFAULT_SPEC",
    "InspectConfig",
    "ModelsConfig",
    "PushConfig",
    "ReportConfig",
    "SaeConfig",
    "SchemaConfig",
    "ValidateConfig",
    "DiagnoseConfig",
    "ExperimentConfig",
    "ExportConfig",
    "FixConfig",
    "NeuronsConfig",
    "ProbeRunConfig",
    "RunConfig",
    "SaeSettings",
    "TrainRunConfig",
    "VlmConfig",
    "build_config",
    "describe_errors",
    "load_config",
    "read_config",
    "DISCOVER",
    "FigureFormat",
    "Figures",
    "ImageSet",
    "ModelSource",
    "NeuronChoice",
    "NeuronSearch",
    "NeuronSource",
    "SettingsPart",
    "Threshold",
    "TrainSettings",
    "TtrSettings",
]


# an action on the run directory, not a setting of the run: never in config.yaml, so that a
# rerun with --config never replaces a run unless asked again
OVERWRITE = Field(
    False,
    exclude=True,
    description="Replace the run already in --out (its run files are removed first); "
    "without it a folder holding a run is refused.",
)


# ------------------------------------------------------------------------------ the run
class RunConfig(SettingsPart):
    """Settings every verb shares: where results go."""

    verb: ClassVar[str] = ""

    out: Path | None = Field(
        None, description="Run directory (default runs/<time>_<model>_<verb>)."
    )
    overwrite: bool = OVERWRITE

    def to_file(self) -> dict[str, JsonValue]:
        """What config.yaml holds: ``verb`` and every field (not ``overwrite``), JSON-typed."""
        return {"verb": self.verb, **self.model_dump(mode="json")}


# ------------------------------------------------------------------------------ one per verb
# pydantic orders fields from the last base to the first, then the class's own: the bases are
# listed so that the model and its images come first in config.yaml and in --help
class DiagnoseConfig(RunConfig, Compilation, Figures, ImageSet, ModelSource):
    verb: ClassVar[str] = "diagnose"

    max_maps: int = Field(
        8, gt=0, le=1024, description="Images whose per-layer maps are kept for figures."
    )
    models: str | None = Field(
        None, description="Comma-separated specs: diagnose each and compare them."
    )
    sink_control: bool = Field(
        False,
        description="Also run the sink-vs-random masking control on the sink heads: the change "
        "of the final features when each head's sink key is removed from the softmax (score "
        "path) or its value zeroed (value path), against as many random keys (four more "
        "passes over the images).",
    )
    checkpoint_every: PositiveInt | None = CHECKPOINT_EVERY

    @model_validator(mode="after")
    def _spec_or_models(self) -> DiagnoseConfig:
        if self.spec and self.models:
            raise ValueError("pass either one spec or models A,B,C, not both")
        return self


def comma_list(v: Any, empty: list[str] | None = None) -> Any:
    """``"1,2"`` -> ``["1", "2"]`` (a string with no part -> ``empty``); other values as
    given."""
    if isinstance(v, str):
        return [part.strip() for part in v.split(",") if part.strip()] or empty
    return v


class NeuronsConfig(RunConfig, Figures, NeuronSearch, ImageSet, ModelSource):
    verb: ClassVar[str] = "neurons"

    stability: bool = Field(
        False,
        description="Also choose the set from each half of the images and report their overlap "
        "(about twice the cost of the selection).",
    )
    check_sizes: list[PositiveInt] | None = Field(
        None,
        description="Comma-separated image sizes (e.g. 112,336) at which the chosen set's fix is "
        "also checked on the held-out images, resized: register neurons can be "
        "resolution-specific.",
    )
    hub_dir: Path | None = Field(
        None,
        description="Also write a hub-ready folder: the set and a model card with its metadata "
        "(upload it with `vitreg push DIR ORG/REPO`).",
    )
    checkpoint_every: PositiveInt | None = CHECKPOINT_EVERY

    _comma_separated = field_validator("check_sizes", mode="before")(comma_list)


class FixConfig(
    RunConfig,
    Figures,
    OvSegProtocol,
    TtrSettings,
    NeuronSearch,
    NeuronChoice,
    ImageSet,
    ModelSource,
):
    verb: ClassVar[str] = "fix"

    method: str = Field(
        "ttr",
        description="Fix: ttr, attention-bias, ablate, clearclip, sclip, naclip, sc-clip, rf-clip "
        "or ov-stitcher; a+b "
        "composes (e.g. ttr+naclip); a,b,... (or any method but ttr) writes a leaderboard "
        "against the unfixed model instead of the before/after report.",
    )
    probe: str | None = Field(
        None,
        description="Leaderboard only: also score each fix with a probe, TASK:DATA (e.g. "
        "ov-seg:voc:DIR for CLIPs with a text tower, segmentation:synthetic-seg:n=32,size=112).",
    )
    save: Path | None = Field(
        None, description="Also save the fixed model here (timm models; load it as local:DIR)."
    )

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

    @model_validator(mode="after")
    def _protocol_for_ov_seg(self) -> FixConfig:
        if self.protocol != "shared" and not (self.probe or "").startswith("ov-seg:"):
            raise ValueError(
                "--protocol published sets ov-seg's settings: give --probe ov-seg:DATA"
            )
        return self


class VlmConfig(RunConfig, TtrSettings, NeuronSearch, NeuronChoice, ImageSet, ModelSource):
    """``vitreg vlm``: a VLM's answers and language->image attention, without and with
    test-time registers on its vision tower."""

    verb: ClassVar[str] = "vlm"

    spec: str = Field(
        description="VLM spec: hf-vlm:ORG/NAME (e.g. hf-vlm:llava-hf/llava-1.5-7b-hf) or "
        "hf-vlm:DIR."
    )
    prompt: str = Field(min_length=1, description="The question asked about each image.")
    query: Literal["answer", "last"] = Field(
        "answer",
        description="Text rows whose attention is mapped: answer (the rows that generated the "
        "answer) or last (the last prompt token).",
    )
    max_new_tokens: int = Field(32, gt=0, le=4096, description="Answer length cap.")
    batch_size: int = Field(8, gt=0, le=65536, description="Images per tower pass.")
    llm_layers: list[PositiveInt] | None = Field(
        None,
        description="Comma-separated language-model layers (k: the output of decoder layer k) "
        "where the sink / dead / alive split of the image tokens is also taken; the input "
        "(projector output) always is.",
    )
    taxonomy_k: int = Field(
        3,
        ge=1,
        le=1000,
        description="Nearest vocabulary tokens per image token in the sink / dead / alive "
        "split (EmbedLens: 3).",
    )
    sink_tokens: list[NonNegativeInt] | None = Field(
        None,
        description="Comma-separated vocabulary ids marking sink tokens (EmbedLens, LLaVA-1.5-7B: "
        "1141,26673); default: found on the run.",
    )
    dead_tokens: list[NonNegativeInt] | None = Field(
        None,
        description="Comma-separated vocabulary ids marking dead tokens (EmbedLens, LLaVA-1.5-7B: "
        "30296); default: the nearest token of the projector's output for a zero feature.",
    )

    _comma_separated = field_validator("llm_layers", "sink_tokens", "dead_tokens", mode="before")(
        comma_list
    )

    @field_validator("spec")
    @classmethod
    def _vlm_spec(cls, v: str) -> str:
        if not v.startswith("hf-vlm:"):
            raise ValueError("must be an hf-vlm: spec, e.g. hf-vlm:llava-hf/llava-1.5-7b-hf")
        return v


class ExportConfig(RunConfig, TtrSettings, NeuronChoice, ImageSet, ModelSource):
    """``vitreg export``: a model's activations at chosen sites, every token labelled, as
    safetensors shards with an index, parquet tables and zarr patch grids."""

    verb: ClassVar[str] = "export"

    layers: list[int] | None = Field(
        None, description="Comma-separated blocks to export, e.g. 6,9,11 (default: the last)."
    )
    site: str = Field(
        "resid_post",
        description="Site of each block: resid_pre, ln1_in, ln1_out, resid_mid, ln2_out, "
        "mlp_post (the neurons) or resid_post; ln_final: the final norm's output.",
    )
    tokens: list[str] = Field(
        ["patches", "cls", "registers", "extra"],
        description="Token kinds to export, comma-separated: patches, cls, registers, extra "
        "(inserted test-time registers).",
    )
    fix: str = Field(
        "none",
        description="The model exported: none, ttr, or any fix of the family (attention-bias, "
        "ablate, clearclip, sclip, naclip, sc-clip, rf-clip, ov-stitcher; a+b composes), with "
        "--neurons.",
    )
    exclude: list[str] = Field(
        [],
        description="Drop the tokens a rule flags, comma-separated: outliers (the bimodal "
        "norm rule), sinks (keys of a head's sink event); counted per image and layer.",
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", description="Precision of the written activations."
    )
    formats: list[str] = Field(
        ["safetensors"],
        description="Comma-separated: safetensors (shards + index.json, always), parquet "
        "(token and image tables), zarr (patch grids [images, H, W, D] per layer), saev "
        "(float32 [CLS] + patch shards and metadata.json, as saev's activation reader maps).",
    )
    shard_size: PositiveInt = Field(256, description="Images per shard.")
    calibration: PositiveInt = Field(
        256, description="The outlier rule is fitted on the first N images' norms."
    )
    lof: bool = Field(
        False,
        description="Also flag each image's LOF anomaly tokens among its patches at every "
        "exported layer (diagnose's lof rule, SC-CLIP's LocalOutlierFactor); slower.",
    )

    @field_validator("layers", "tokens", "exclude", "formats", mode="before")
    @classmethod
    def _comma_separated(cls, v: Any) -> Any:
        # a repeated option gives a list, each of whose values may hold several parts
        if isinstance(v, list):
            return [part for item in v for part in comma_list(str(item), [])]
        return comma_list(v, [])

    @field_validator("site")
    @classmethod
    def _site(cls, v: str) -> str:
        from vitreg.export.sites import SITES, site_suffix

        if v not in SITES and v != "ln_final.hook_out":
            site_suffix(v)  # a block suffix such as mlp.hook_post, or the one message
        return v

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, v: list[str]) -> list[str]:
        from vitreg.export.sites import token_kinds

        token_kinds(v)
        return v

    @field_validator("fix")
    @classmethod
    def _fix(cls, v: str) -> str:
        from vitreg.fix.methods import FIXES

        v = v.strip().replace(" ", "")
        if v != "none":
            FIXES.parts(v)
        return v

    @field_validator("exclude")
    @classmethod
    def _rules(cls, v: list[str]) -> list[str]:
        bad = [r for r in v if r not in ("outliers", "sinks")]
        if bad:
            raise ValueError(f"{bad}: --exclude takes outliers and/or sinks")
        return v

    @model_validator(mode="after")
    def _formats(self) -> ExportConfig:
        from vitreg.export.formats import FORMATS

        bad = [f for f in self.formats if f not in FORMATS]
        if bad:
            raise ValueError(f"formats {bad}: choose from {', '.join(FORMATS)}")
        if "safetensors" not in self.formats:
            self.formats = ["safetensors", *self.formats]
        return self


class ProbeRunConfig(RunConfig, Figures, OvSegProtocol, TtrSettings, ModelSource):
    """``vitreg probe``: linear probes on frozen tokens, with and without test-time registers."""

    verb: ClassVar[str] = "probe"

    task: str = Field(
        "classification",
        description="classification, token-type, position, reconstruction, segmentation, "
        "depth, object-discovery, zero-shot (CLIP with its text tower), attention-seg, ov-seg "
        "(open-vocabulary segmentation, SCLIP protocol) or pruning (top-1 as the patch tokens "
        "kept by [CLS] attention, received attention, SToP's sink-aware score or at random "
        "shrink from 90% to 10%).",
    )
    data: str = Field(
        "synthetic-cls:n=200",
        description="Dataset: imagefolder:DIR, voc:DIR, voc-boxes:DIR, ade20k:DIR, nyu:DIR, or "
        "the seeded synthetic shapes synthetic-cls, synthetic-seg, synthetic-depth, "
        "synthetic-boxes or synthetic (all targets), with parameters such as "
        ":n=200,size=64,seed=0. Train split -> probe, val split -> scores.",
    )
    fix: str = Field(
        "none",
        description="none (the bare model), both (bare and with test-time registers, side by "
        "side), a fix method of `vitreg fix --method` (clearclip, sclip, naclip, sc-clip, rf-clip, "
        "ov-stitcher, "
        "ttr+naclip, ...: bare and fixed, side by side), or a neuron source as --neurons of "
        "`vitreg fix` names it (with the fix only).",
    )
    neurons: NeuronSource = Field(
        DISCOVER,
        description="With --fix both (or a method that edits register neurons): a NeuronSet "
        "file, builtin, or discover (find them first, as `vitreg neurons` does).",
    )
    pamr: int = Field(
        0,
        ge=0,
        le=1000,
        description="ov-seg: PAMR refinement steps on the upsampled logits (0: off; NACLIP's "
        "published setting is 10, at dilations 8 and 16).",
    )
    layers: str = Field(
        "-1",
        description="Comma-separated blocks (negative from the end), 'final', or hook names.",
    )
    templates: Path | None = Field(
        None,
        description="zero-shot: prompt templates, one per line with {} for the class name "
        "(default: OpenAI's 80 ImageNet templates).",
    )
    cache: Path = Field(
        Path(".vitreg-cache") / "features",
        description="Feature cache folder (reused across runs).",
    )
    seeds: int = Field(3, gt=0, le=1000, description="Probe training seeds (mean and 95% CI).")
    epochs: int = Field(30, gt=0, le=100_000, description="Epochs per probe (early stopping).")
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="adamw or sgd.")
    batch_size: int = BATCH

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
        from vitreg.fix.methods import FIXES, is_entry

        if v in ("none", "both"):
            return v
        if is_entry(v):  # a method name wins over a file of that name
            FIXES.parts(v)
            return v.replace(" ", "")
        if "," in v and all(is_entry(e) for e in v.split(",")):
            raise ValueError(
                "probe takes one fix; `vitreg fix --method a,b --probe TASK:DATA` compares several"
            )
        source = NeuronSource.parse(v)
        if source.kind == "file" and not Path(v).exists():
            raise ValueError(
                "neither none, both, builtin nor an existing NeuronSet file (neurons.json from "
                "`vitreg neurons`)"
            )
        return source

    @field_validator("neurons")
    @classmethod
    def _neurons_with_fix_both(cls, v: NeuronSource, info: Any) -> NeuronSource:
        fix = info.data.get("fix")  # absent when fix itself is wrong
        if v.kind != "discover" and fix == "none":
            raise ValueError("applies to fix both only; with fix none there is no fix")
        from vitreg.fix.methods import is_entry

        if v.kind != "discover" and fix not in (None, "both") and not is_entry(fix):
            raise ValueError("give the neurons once: fix FILE, or fix both with neurons FILE")
        return v

    @field_validator("pamr")
    @classmethod
    def _pamr_for_ov_seg(cls, v: int, info: Any) -> int:
        if v and info.data.get("task") not in (None, "ov-seg"):
            raise ValueError("PAMR refines ov-seg's pixel logits; other tasks take none")
        return v

    @model_validator(mode="after")
    def _protocol_for_ov_seg(self) -> ProbeRunConfig:
        if self.protocol != "shared" and self.task != "ov-seg":
            raise ValueError("--protocol published sets ov-seg's settings; other tasks take none")
        if self.protocol != "shared" and self.pamr:
            raise ValueError("--protocol published takes PAMR from each method's settings")
        return self

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

        name = info.data.get("task", "")
        task = TASKS.get(name) if name in TASKS else None
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


class TrainRunConfig(RunConfig, TrainSettings):
    """``vitreg train``: train a ViT (supervised DeiT-III or DINO/iBOT); the training settings
    are :class:`~vitreg.settings.train.TrainSettings`, what :func:`vitreg.train.train` takes."""

    verb: ClassVar[str] = "train"

    variant: str = Field(
        description="timm ViT name (e.g. vit_tiny_patch16_224) or vitreg variant (vitreg_*)."
    )
    data: str = Field(description="Dataset spec: imagefolder:DIR, synthetic-cls:n=64,size=32, ...")
    model_arg: list[str] | None = Field(
        None,
        description="Model constructor argument KEY=VALUE (repeatable), e.g. depth=2.",
    )
    option: list[str] | None = Field(
        None, description="Recipe option KEY=VALUE (repeatable), e.g. n_local_crops=2."
    )

    @field_validator("epochs", "lr", "min_lr", "weight_decay", "clip_grad")
    @classmethod
    def _finite_number(cls, v: float | None, info: Any) -> float | None:
        return finite(v, info.field_name)

    _device = field_validator("device")(valid_device)
    _size = field_validator("img_size")(valid_img_size)

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


class ExperimentConfig(RunConfig, Figures):
    """``vitreg experiment variants``: train, probe and diagnose the ViT variant grid."""

    verb: ClassVar[str] = "experiment"

    data: str = Field(
        description="Dataset spec or image folder: synthetic:n=256,size=48 (labels, masks, "
        "depth: all probes) or imagefolder:DIR (labels only: classification probe only)."
    )
    out: Path | None = Field(
        None, description="Experiment folder (default runs/<time>_variants_experiment)."
    )
    size: str | None = Field(
        None, description="tiny (default on CPU, ~1 min per variant) or small (default on GPU)."
    )
    steps: PositiveInt | None = Field(None, description="Training steps per variant.")
    recipe: Literal[RECIPES] = Field(  # type: ignore[valid-type]
        "dino", description="dino (default: the dense iBOT loss the gains need) or supervised."
    )
    include_gap: bool = Field(True, description="Add the GAP baseline (average pooling, no [CLS]).")
    finetune: str | None = Field(
        None,
        description="Also fine-tune this timm ViT as is and converted to +early QKV (random "
        "init unless --pretrained).",
    )
    pretrained: bool = Field(
        False, description="Load --finetune's timm weights (needs them cached or online)."
    )
    seeds: PositiveInt | None = Field(
        None, description="Training seeds per variant (default 1; 3 measures noise)."
    )
    batch_size: PositiveInt | None = Field(None, description="Global batch.")
    threads: PositiveInt | None = Field(
        None, description="torch CPU threads (default: 1 for tiny on CPU)."
    )

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


class SaeConfig(
    RunConfig, Figures, SaeSettings, TtrSettings, NeuronSearch, NeuronChoice, ImageSet, ModelSource
):
    """``vitreg experiment sae [SPEC]``: the same SAE on raw, outlier-free and fixed
    activations (the fix: test-time registers, its neurons as ``vitreg fix`` takes them)."""

    verb: ClassVar[str] = "sae"


# -------------------------------------------------------- commands that read, list or upload
class CompareConfig(Figures):
    """``vitreg compare RUN...``: the headline metrics of several runs in one table."""

    verb: ClassVar[str] = "compare"

    runs: list[Path] = Field(description="Run directories (each with a metrics.json).")
    out: Path | None = Field(
        None,
        description="Also write comparison.md, report.html (wide table, curves) and "
        "comparison.json here.",
    )
    contains: str | None = Field(None, description="Only metrics whose name contains this text.")
    overwrite: bool = OVERWRITE


class ValidateConfig(SettingsPart):
    """``vitreg validate RUN...``: check folders vitreg wrote against the schema."""

    verb: ClassVar[str] = "validate"

    runs: list[Path] = Field(
        description="Folders vitreg wrote (runs or their metrics.json, comparisons, leaderboards)."
    )


class ReportConfig(SettingsPart):
    """``vitreg report RUN``: render a run's report again from its saved results."""

    verb: ClassVar[str] = "report"

    run: Path = Field(
        description="A folder vitreg wrote (a run, a comparison or a fix leaderboard)."
    )


class SchemaConfig(SettingsPart):
    """``vitreg schema``: the JSON Schema of metrics.json."""

    verb: ClassVar[str] = "schema"

    out: Path | None = Field(
        None, description="Write the schema to this file instead of printing it."
    )
    overwrite: bool = Field(
        False,
        exclude=True,
        description="Replace the file already at --out; without it an existing file is refused.",
    )


class InspectConfig(ModelSource):
    """``vitreg inspect SPEC``: a model's family, dims, token layout and hook names."""

    verb: ClassVar[str] = "inspect"

    spec: str = Field(description="Model spec, e.g. timm:vit_small_patch14_reg4_dinov2.lvd142m")
    hooks: bool = Field(False, description="List the canonical hook names.")
    as_json: bool = Field(False, description="Print machine-readable JSON.")


class ModelsConfig(SettingsPart):
    """``vitreg models``: the supported model families."""

    verb: ClassVar[str] = "models"

    as_json: bool = Field(False, description="Print machine-readable JSON.")


class PushConfig(SettingsPart):
    """``vitreg push DIR ORG/REPO``: upload a neuron set's hub folder."""

    verb: ClassVar[str] = "push"

    directory: Path = Field(description="Hub folder written by `vitreg neurons --hub-dir`.")
    repo: str = Field(description="Hub repository ORG/REPO (created if missing).")
    private: bool = Field(False, description="Create the repository private.")
    revision: str | None = Field(None, description="Branch to commit to.")


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
    from vitreg.core.verb import VERBS
    from vitreg.core.yaml_strict import refuse_bool_numbers, refuse_duplicate_keys

    p = Path(path)
    if not p.is_file():
        raise InputError(f"--config {p}: no such file (pass the config.yaml of a run)")
    raw = read_yaml(p, "--config")
    refuse_duplicate_keys(p, "--config")
    if not isinstance(raw, dict):
        raise InputError(f"--config {p} holds a {type(raw).__name__}, not a mapping of settings")
    if verb in VERBS:
        flags = {str(k): v for k, v in raw.items() if isinstance(v, bool)}
        refuse_bool_numbers(flags, VERBS[verb].config.model_fields, f"--config {p}")
    if "overwrite" in raw:  # replacing a run is asked on the command line only
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
    from vitreg.core.verb import VERBS

    return build_config(VERBS[verb].config, read_config(path, verb), f"--config {path}")


__getattr__ = renamed(__name__, {"Part": "SettingsPart"}, globals())
