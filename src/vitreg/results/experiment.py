"""``vitreg experiment`` results: every variant's costs, probes and diagnosis over its seeds,
the settings and the conclusions the numbers allow."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    FieldSerializationInfo,
    JsonValue,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    field_serializer,
    model_validator,
)

from vitreg.results.base import ResultsModel, SparseResults
from vitreg.results.train import DinoTerms

#: serialization context of the experiment's own records (experiment.json, result.json): the
#: DINO preset options in the order they were given, not the schema's
AS_GIVEN = {"dino_order": "as_given"}


def _as_dict(self: ResultsModel) -> dict[str, JsonValue]:
    """Deprecated: the fields as the experiment's records hold them."""
    warnings.warn(
        f"{type(self).__name__}.as_dict() is now .model_dump(mode='json'); the old name goes "
        "in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return self.model_dump(mode="json", context=AS_GIVEN)


#: blocks a component is specialised in: "all", the first N, or their indices
BlockSelection = str | int | list[int] | None


class VariantOptions(SparseResults):
    """A variant's ``create_variant`` options; an option the grid leaves at its default is
    left out."""

    specialize: list[str] = Field(description="components given a [CLS]-stream copy")
    registers: int | None = None
    qkv_blocks: BlockSelection = None
    proj_blocks: BlockSelection = None
    mlp_blocks: BlockSelection = None
    register_stream: str | None = None
    final_norm: str | None = None
    attn_bias: bool | None = None
    pool: str | None = None


class Variant(ResultsModel):
    """One grid entry: a name, its ``create_variant`` options, and how it is grouped; fields
    by keyword, or name, options, specialisation, handling and finetune in this order."""

    model_config = ConfigDict(frozen=True)

    name: str
    options: VariantOptions
    specialisation: str  # a key of vitreg.experiment.grid.SPECIALISATION_TITLES
    handling: str  # a key of vitreg.experiment.grid.HANDLING_TITLES
    finetune: str | None = None  # timm model name, for the fine-tuning entries

    def __init__(self, *args: Any, **fields: Any) -> None:
        """Validate ``fields``, the first of them possibly given by position."""
        super().__init__(**dict(zip(VARIANT_ORDER, args, strict=False)), **fields)

    as_dict = _as_dict


VARIANT_ORDER = ("name", "options", "specialisation", "handling", "finetune")


class ParamCounts(ResultsModel):
    """Parameter counts: the variant's, its shared baseline's, and the extra per component."""

    total: int
    baseline: int
    extra: dict[str, int] = Field(description="component -> extra parameters")
    percent: dict[str, float] = Field(description="component -> extra, % of the baseline")
    extra_total: int


class FlopDeltas(ResultsModel):
    """FLOPs a variant adds over its shared model, by cause."""

    specialisation: int
    attn_bias: int
    registers: int


class FlopCounts(ResultsModel):
    """FLOPs of one forward at the variant's image size, and of the same shared model."""

    image_size: list[int]
    tokens: int
    registers: int
    flops: int
    flops_shared: int
    delta: FlopDeltas


class DinoPresetOptions(SparseResults):
    """The DINO recipe options the size preset sets (the rest keep the recipe's defaults)."""

    n_local_crops: int | None = None
    local_size: int | None = None
    global_scale: list[float] | None = None
    local_scale: list[float] | None = None
    out_dim: int | None = None
    hidden_dim: int | None = None
    bottleneck_dim: int | None = None
    student_temp: float | None = None
    teacher_temp: float | None = None
    teacher_temp_start: float | None = None
    teacher_temp_warmup: float | None = None
    momentum: float | None = None
    center_momentum: float | None = None
    mask_prob: float | None = None
    mask_ratio: list[float] | None = None
    dino_weight: float | None = None
    ibot_weight: float | None = None

    _given: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """The options as validated, knowing the order they were given in."""
        made = handler(data)
        if isinstance(data, Mapping) and not made._given:
            made._given = tuple(str(k) for k in data)
        return made

    def given_order(self) -> tuple[str, ...]:
        """The options' names in the order they were given (schema order if built otherwise)."""
        given = self.model_fields_set
        return self._given or tuple(k for k in type(self).model_fields if k in given)


class ExperimentSettings(ResultsModel):
    """The size preset: the shared architecture, training, probes and diagnosis (defaults: the
    ``tiny`` preset)."""

    model_config = ConfigDict(frozen=True)

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
    seeds: int = Field(1, description="training seeds per variant")
    dino: DinoPresetOptions = Field(
        default_factory=lambda: DinoPresetOptions.model_validate(
            {
                "out_dim": 256,
                "hidden_dim": 256,
                "bottleneck_dim": 64,
                "n_local_crops": 2,
                "momentum": 0.9,  # a fast EMA teacher: the exported teacher reflects 50 steps
            }
        )
    )
    probe_epochs: int = 20
    probe_seeds: int = 1
    probe_lrs: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    diagnose_images: int = 32
    batch_eval: int = 32

    @field_serializer("dino", mode="wrap")
    def _dino(
        self,
        dino: DinoPresetOptions,
        handler: SerializerFunctionWrapHandler,
        info: FieldSerializationInfo,
    ) -> Any:
        """Schema order, or the order given under the :data:`AS_GIVEN` context."""
        out = handler(dino)
        if info.context != AS_GIVEN:
            return out
        return {k: out[k] for k in (*dino.given_order(), *out) if k in out}

    def model_kwargs(self) -> dict[str, int | float]:
        """timm constructor arguments of the shared base architecture."""
        return {
            "depth": self.depth,
            "embed_dim": self.embed_dim,
            "num_heads": self.num_heads,
            "patch_size": self.patch_size,
            "init_values": self.init_values,
        }

    def with_(self, **changes: Any) -> ExperimentSettings:
        """A copy with ``changes`` validated (``None`` values are ignored, so CLI defaults pass
        through)."""
        given = {k: v for k, v in changes.items() if v is not None}
        return type(self).model_validate({**dict(self), **given})

    as_dict = _as_dict


class SeedStats(ResultsModel):
    """One number over a variant's seeds: mean, sample std (None for one seed), values."""

    mean: float | None
    std: float | None
    values: list[float | None]


class VariantTime(ResultsModel):
    """Seconds spent training and evaluating one variant."""

    train: float
    evaluate: float


class VariantSummary(Variant):
    """One variant over its training seeds."""

    folder: str
    seeds: list[int]
    summary: dict[str, SeedStats] = Field(description="headline number -> over seeds")
    per_block: dict[str, list[float | None]] = Field(description="number -> per block")
    params: ParamCounts
    flops: FlopCounts
    verdicts: list[str]
    losses: list[list[float]]
    dino_terms: DinoTerms | None = None
    time_s: VariantTime
    reused: bool
    notes: list[str]


class Timing(ResultsModel):
    """Wall and compute time of this invocation, and variants reused from earlier ones."""

    wall_s: float
    compute_s: float
    reused: int


class ExperimentResults(ResultsModel):
    """``vitreg experiment``: every variant's costs, probes and diagnosis."""

    complete: bool
    n_done: int
    n_total: int
    settings: ExperimentSettings
    data: str
    tasks: list[str]
    skipped_tasks: dict[str, str] = Field(default_factory=dict)
    variants: list[VariantSummary]
    timing: Timing
    majority_rate: float | None = None
    conclusions: list[str]
