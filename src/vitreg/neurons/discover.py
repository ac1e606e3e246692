"""Register-neuron discovery (Jiang et al. 2025, Algorithm 1), batched and streaming.

For every image with outliers at the detection layer, each MLP unit of the searched layers gets
the mean activation over the outlier positions; scores are those means averaged over such
images, ranked globally over (layer, unit). Activations of the searched layers are held only for
the current batch (memory independent of the image count); the statistics are sums, so under
torchrun they are merged and every rank gets the single-process ranking.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from vitreg.analysis.rules import MASK_RULES, image_mask
from vitreg.core.renamed import loose_settings
from vitreg.errors import InputError, VitregError
from vitreg.fix.neuron_set import NeuronSet, weights_fingerprint
from vitreg.hooks.names import hook_name
from vitreg.hooks.reducers import Reducer
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model
from vitreg.neurons.detection import choose_detection, layer_index
from vitreg.progress import Update
from vitreg.results.neurons import DetectionRecord
from vitreg.settings.neurons import NeuronSearch

THRESHOLDS = MASK_RULES
outlier_mask = image_mask  # ``[B, N]`` outlier mask from per-token norms under a rule
DISCOVER_K = 64  # candidates ranked when the search leaves top-k to the automatic path
BLOCK_K = 16  # a wider ranking adds the best this many of each block from the first one
# written to: a weak group before the emergence block ranks below earlier blocks' ordinary units


class Searched(NamedTuple):
    """Where discovery looks: the detection layer and its rule, the searched blocks, and the
    survey that chose them (``None`` when the search gave everything)."""

    detect: int
    highest: int
    lowest: int
    rule: str
    value: float | None
    detection: DetectionRecord | None

    @property
    def layers(self) -> list[int]:
        """The searched blocks, lowest first."""
        return list(range(self.lowest, self.highest + 1))


@loose_settings("search", NeuronSearch, ("detect_layer", "highest_layer", "threshold", "top_k"))
def discover(
    model: Model,
    data: Any,
    search: NeuronSearch | None = None,
    *,
    detection: DetectionRecord | None = None,
    lowest_layer: int = 0,
    signed: bool = False,
    sparsity: tuple[float, float] | None = None,
    include_prefix: bool = False,
    batch_size: int = 32,
    limit: int | None = None,
    calibration_images: int = 32,
    per_block: int = 0,
    progress: Update | None = None,
) -> NeuronSet:
    """Rank register neurons; returns the ``search.top_k`` best (:data:`DISCOVER_K` for
    'auto') as a :class:`NeuronSet`, then (``per_block``) the best ``per_block`` of every
    searched block from the survey's first written one that are not among them.

    ``search.threshold``: 'auto' (valley of the bimodal norm distribution), a number (absolute
    norm), 'mean3std' (per image, paper A.4) or 'robust' (per image, median + 3.5 MAD on log
    norms); the rules are those of :mod:`vitreg.analysis.rules`.
    What ``search`` leaves open -- detection layer, 'auto' threshold, and (then) the highest
    searched layer -- is chosen by :func:`~vitreg.neurons.detection.choose_detection` on the
    first ``calibration_images`` (or taken from ``detection``, which then decides every layer
    and the threshold): the searched range then ends at the emergence layer. With
    ``search.detect_layer`` and a numeric or per-image ``search.threshold`` given, nothing is
    surveyed and ``search.highest_layer`` defaults to the detection layer (the paper's settings
    reproduce its ranking); a highest layer above the detection layer is honoured (those units
    are scored against the outliers found below them, as the official code scores all).

    ``signed=False`` averages ``|activation|`` like the official code; ``sparsity=(a, f)`` keeps a
    unit's per-image score only if at least a fraction ``f`` of tokens have (signed) activation
    below ``a`` (the reference notebook's filter, on the activation itself, not its magnitude). Outliers are patch tokens unless ``include_prefix``
    (the official code counts [CLS] among them: ``include_prefix=True`` reproduces it).

    The statistic is one reducer (:class:`OutlierActivations`) of a ``Model.trace``, which
    shards it under torchrun (each rank scores its part of every batch, or its own shards of a
    webdataset source), merges the sums so every rank returns the single-process ranking, and
    checkpoints it inside ``vitreg.core.checkpoint.resumable``.
    """
    search = search if search is not None else NeuronSearch()
    where = searched_layers(
        model,
        data,
        search,
        detection,
        lowest_layer=lowest_layer,
        n_images=calibration_images,
        batch_size=batch_size,
    )
    _check_top_k(search, where, model.d_mlp)
    stats = OutlierActivations(
        hook_name(where.detect, "hook_resid_post"),
        [hook_name(layer, "mlp.hook_post") for layer in where.layers],
        [layer > where.detect for layer in where.layers],
        model.d_mlp,
        where.rule,
        where.value,
        signed=signed,
        sparsity=sparsity,
        include_prefix=include_prefix,
    )
    last = max(where.detect, where.highest) + 1  # later blocks feed none of these sites
    model.trace(data, [stats], batch_size, limit=limit, progress=progress, stop_at_layer=last)
    if stats.images_with == 0:
        raise VitregError(
            f"none of the {stats.images_seen} images has an outlier token at layer "
            f"{where.detect} under this threshold; discovery would rank noise. Lower the "
            "threshold, pick another detection layer, or run `vitreg diagnose` first"
        )
    return ranked_set(model, stats, where, ranked_count(search), per_block=per_block)


def _check_top_k(search: NeuronSearch, where: Searched, d_mlp: int) -> None:
    """Refuse a fixed top-k above the units of the searched blocks: the set would be every
    candidate, which is no choice of register neurons."""
    n = len(where.layers) * d_mlp
    if search.top_k != "auto" and search.top_k > n:
        raise InputError(
            f"--top-k {search.top_k} asks for more neurons than there are candidates: the "
            f"searched blocks {where.lowest}-{where.highest} hold {n} MLP units "
            f"({len(where.layers)} x {d_mlp}); pass --top-k {n} or fewer (register neurons are "
            "a few units, e.g. --top-k 20), raise --highest-layer to search more blocks, or "
            "--top-k auto to let the causal check choose"
        )


def ranked_count(search: NeuronSearch) -> int:
    """How many candidates discovery ranks: the search's top-k, or :data:`DISCOVER_K`."""
    return DISCOVER_K if search.top_k == "auto" else search.top_k


def searched_layers(
    model: Model,
    data: Any,
    search: NeuronSearch,
    detection: DetectionRecord | None,
    *,
    lowest_layer: int,
    n_images: int,
    batch_size: int,
) -> Searched:
    """The detection layer, rule and searched blocks: ``detection``'s, else what ``search``
    gives, with the rest surveyed on the first ``n_images`` of ``data``."""
    n_layers = model.n_layers
    rule = "absolute" if isinstance(search.threshold, (int, float)) else search.threshold
    if rule not in THRESHOLDS:
        raise ValueError(
            f"threshold must be one of {THRESHOLDS} or a number, got {search.threshold!r}"
        )
    if detection is None and (rule == "auto" or search.detect_layer is None):
        detection = choose_detection(
            model,
            data,
            search,
            lowest_layer=max(0, lowest_layer),
            n_images=n_images,
            batch_size=batch_size,
        )
    if detection is not None:
        return Searched(
            detection.detect_layer,
            detection.highest_layer,
            max(0, detection.lowest_layer),
            detection.threshold,
            detection.threshold_value,
            detection,
        )
    assert search.detect_layer is not None  # no survey: the search gave the detection layer
    detect = layer_index(search.detect_layer, n_layers, "detection layer")
    top = search.highest_layer if search.highest_layer is not None else detect
    value = float(search.threshold) if rule == "absolute" else None
    return Searched(detect, layer_index(top, n_layers), max(0, lowest_layer), rule, value, None)


def ranked_set(
    model: Model, stats: OutlierActivations, where: Searched, top_k: int, per_block: int = 0
) -> NeuronSet:
    """The ``top_k`` best-scored units of ``stats`` (searched at ``where``) as a NeuronSet that
    records the search; with ``per_block``, also the best ``per_block`` of every searched block
    from the survey's first written one on, after them by score."""
    scores = stats.score_sum / stats.images_with
    flat = scores.flatten()
    picked = flat.topk(min(top_k, flat.numel())).indices.tolist()
    first = where.detection.first_written if where.detection is not None else None
    if per_block and first is not None:
        taken = set(picked)
        extra = [
            j * model.d_mlp + u
            for j, layer in enumerate(where.layers)
            if layer >= first
            for u in scores[j].topk(min(per_block, model.d_mlp)).indices.tolist()
            if j * model.d_mlp + u not in taken
        ]
        picked += sorted(extra, key=lambda i: -float(flat[i]))
    k = len(picked)
    index = torch.tensor(picked, dtype=torch.long)
    units = (index % model.d_mlp).tolist()
    layers = [where.layers[i] for i in (index // model.d_mlp).tolist()]
    values = flat[index]
    settings = {
        "detect_layer": where.detect,
        "highest_layer": where.highest,
        "lowest_layer": where.lowest,
        "threshold": where.rule,
        "threshold_value": where.value,
        "signed": stats.signed,
        "sparsity": list(stats.sparsity) if stats.sparsity else None,
        "include_prefix": stats.include_prefix,
        "top_k": k,
        "detection": where.detection.model_dump() if where.detection else None,
    }
    data_desc = {"n_images": stats.images_seen, "n_images_with_outliers": stats.images_with}
    return NeuronSet(
        layers,
        units,
        [float(s) for s in values],
        model.spec,
        model.family,
        model.n_layers,
        model.d_mlp,
        weights_fingerprint(model.module),
        settings,
        data_desc,
    )


class OutlierActivations(Reducer):
    """Algorithm 1's statistic as one reducer of a ``Model.trace``: the outlier tokens of each
    image at the detection site, and each searched unit's mean activation over them, summed over
    the images that have any (``score_sum[j]``: searched layer ``j``). Activations of a layer
    before the detection site are held until it fires in the same batch (one batch at a time)."""

    def __init__(
        self,
        detect_site: str,
        layer_sites: list[str],
        after_detect: list[bool],
        d_mlp: int,
        rule: str,
        value: float | None,
        *,
        signed: bool = False,
        sparsity: tuple[float, float] | None = None,
        include_prefix: bool = False,
    ) -> None:
        super().__init__(detect_site)
        self.layer_sites = list(layer_sites)
        self.after_detect = list(after_detect)
        self.rule, self.value = rule, value
        self.signed, self.sparsity, self.include_prefix = signed, sparsity, include_prefix
        self.score_sum = torch.zeros(len(layer_sites), d_mlp, dtype=torch.float64)
        self.images_with = 0
        self.images_seen = 0
        self.held: dict[str, torch.Tensor] = {}  # this batch's activations, until the mask
        self.weights: torch.Tensor | None = None  # this batch's [B, N] mean-over-outliers
        self.has: torch.Tensor | None = None  # this batch's [B] images with outliers
        # the site that ends a batch's work: the last searched layer after the detection site
        ends = [name for name, a in zip(layer_sites, after_detect, strict=True) if a]
        self.last = ends[-1] if ends else detect_site

    @property
    def sites(self) -> tuple[str, ...]:
        return (self.site, *self.layer_sites)

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        if ctx.name == self.site:
            self._mask(t, ctx)
            for name in list(self.held):
                self._add(name, self.held.pop(name))
        else:
            acts = t.float()  # signed: the sparsity filter reads the activation itself
            if self.after_detect[self.layer_sites.index(ctx.name)]:
                self._add(ctx.name, acts)
            else:
                self.held[ctx.name] = acts  # scored once the detection site has the outliers
        if ctx.name == self.last:  # nothing of this batch is kept past it
            self.weights = self.has = None

    def _mask(self, t: torch.Tensor, ctx: HookContext) -> None:
        mask = image_mask(t.float().norm(dim=-1), self.rule, self.value)
        if not self.include_prefix and ctx.layout is not None:
            mask[:, ctx.layout.prefix] = False
        count = mask.sum(1)  # [B]
        self.has = count > 0
        self.images_seen += t.shape[0]
        self.images_with += int(self.has.sum())
        self.weights = mask.float() / count.clamp_min(1)[:, None]  # mean over the outliers

    def _add(self, name: str, acts: torch.Tensor) -> None:
        """Add each image's mean activation over its outlier tokens to the layer's scores."""
        assert self.weights is not None and self.has is not None
        values = acts if self.signed else acts.abs()
        per_image = torch.einsum("bn,bnu->bu", self.weights, values)
        if self.sparsity is not None:
            a, f = self.sparsity
            per_image = per_image * ((acts < a).float().mean(1) >= f)  # [B, U]
        j = self.layer_sites.index(name)
        self.score_sum[j] += per_image[self.has].double().sum(0).cpu()

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, OutlierActivations)
        self.score_sum += other.score_sum
        self.images_with += other.images_with
        self.images_seen += other.images_seen

    def result(self) -> dict[str, torch.Tensor | int]:
        return {
            "score_sum": self.score_sum,
            "images_with": self.images_with,
            "images_seen": self.images_seen,
        }
