"""``vitreg export``: the index of an exported activation folder (``index.json``, read back by
:func:`vitreg.export.open`) and the results block of its metrics.json."""

from __future__ import annotations

from pydantic import Field

from vitreg.results.base import ResultsModel

INDEX_FORMAT = "vitreg-export"
INDEX_VERSION = 1


class ExportSettings(ResultsModel):
    """What decides the exported numbers: a resume with other settings is refused."""

    spec: str
    weights: str = Field(description="fingerprint of the model's parameters")
    sites: list[str] = Field(description="the hook sites exported, one per layer")
    layers: list[str] = Field(description="the layer names, as the files' keys use them")
    tokens: list[str]
    fix: str
    fix_description: str | None = None
    dtype: str
    shard_size: int
    exclude: list[str]
    calibration: int
    lof: bool = False
    formats: list[str]
    images: str = Field(description="the image source, as given")
    limit: int | None
    img_size: int | None


class OutlierRule(ResultsModel):
    """The outlier rule of one exported layer: diagnose's bimodal fit of the patch norms at
    ``site`` (the residual stream after the block), fitted on the first ``n_images`` images."""

    site: str
    rule: str = "auto"
    cut: float | None = Field(description="norm above which a patch is an outlier (None: none)")
    bimodal: bool
    n_images: int


class LayoutInfo(ResultsModel):
    """The token layout at the exported sites (inserted test-time registers included)."""

    n_cls: int
    n_reg: int
    n_extra: int
    grid: list[int]
    patch_size: list[int]
    n_tokens: int


class ShardInfo(ResultsModel):
    """One finished shard: its file, its images (global positions) and per layer how many
    token rows it holds and how many it dropped by each ``--exclude`` rule, per image."""

    file: str
    first_image: int
    n_images: int
    names: list[str]
    rows: dict[str, int]
    excluded: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict, description="layer -> rule -> dropped tokens per image"
    )
    outliers: dict[str, int] = Field(default_factory=dict, description="flagged tokens per layer")
    sink_keys: dict[str, int] = Field(
        default_factory=dict, description="(token, head) sink events per layer"
    )
    lof: dict[str, int] = Field(
        default_factory=dict, description="LOF anomaly tokens per layer (with --lof)"
    )
    bytes: int = 0


class ExportIndex(ResultsModel):
    """``index.json``: what was exported, how each token is flagged, and the shards written so
    far (``complete`` once every shard of the run is)."""

    format: str = INDEX_FORMAT
    version: int = INDEX_VERSION
    settings: ExportSettings
    layout: LayoutInfo
    d_model: int
    token_kinds: list[str] = Field(description="kind code -> name, as the `kind` column holds")
    outlier_rules: dict[str, OutlierRule]
    shards: list[ShardInfo]
    complete: bool = False
    n_images: int = 0


class LayerSummary(ResultsModel):
    """One exported layer over the run: rows written, flagged and dropped tokens."""

    layer: str
    site: str
    rows: int
    outliers: int
    outlier_rate: float = Field(description="flagged patches / patches")
    outlier_cut: float | None
    sink_events_per_image: float
    excluded: dict[str, int]
    lof_tokens: int | None = Field(None, description="LOF anomaly tokens (None: not computed)")


class ExportResults(ResultsModel):
    """``vitreg export``: what was written and how fast."""

    n_images: int
    n_shards: int
    shard_size: int
    site: str
    tokens: list[str]
    dtype: str
    fix: str
    formats: list[str]
    layers: list[LayerSummary]
    bytes_written: int = Field(description="bytes of the shards this run wrote (not those resumed)")
    seconds: float
    images_per_second: float = Field(description="images of the shards this run wrote, per second")
    write_mb_per_s: float
    resumed_shards: int = Field(description="shards found finished and kept")
    index: str = "index.json"
