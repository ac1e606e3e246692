"""The export loop: the model's activations at the chosen sites, labelled, written shard by
shard. Memory holds one batch and one shard; each finished shard is a file set of its own, so
a killed or failed run resumes from the shards it finished, and ``torchrun`` ranks write
alternate shards of one index (shard ``s`` belongs to rank ``s mod world``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from vitreg.analysis.thresholds import bimodal_fit
from vitreg.core.layout import TokenLayout
from vitreg.export.labels import (
    LayerBatch,
    Positions,
    label_layer,
    lof_labels,
    outlier_flags,
    sink_counts,
)
from vitreg.export.shard import Shard, read_info, shard_name
from vitreg.export.sites import Layer
from vitreg.hooks.reducers import as_tokens, token_norms
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model
from vitreg.progress import Update
from vitreg.results.export import OutlierRule, ShardInfo

#: ``names(start, n)``: the file names of images ``start..start+n`` of the stream
Names = Callable[[int, int], list[str]]
HookBody = Callable[[torch.Tensor, HookContext], None]


@dataclass(frozen=True)
class Plan:
    """How to export: the layers, token kinds, exclusion rules, dtype, shard size, formats."""

    layers: list[Layer]
    kinds: list[str]
    exclude: list[str]
    dtype: torch.dtype
    shard_size: int
    formats: list[str]
    batch_size: int
    lof: bool = False


@dataclass
class Calibration:
    """What the first images tell: each layer's outlier rule, the layout, the width."""

    rules: dict[str, OutlierRule]
    layout: TokenLayout
    d_model: int


@dataclass
class Captured:
    """One forward pass at the exported sites: by layer key its activations, rule-site norms
    and sink-head counts; the layout seen."""

    acts: dict[str, torch.Tensor]
    rule_norms: dict[str, torch.Tensor]
    sinks: dict[str, torch.Tensor]
    layout: TokenLayout | None = None


def forward(
    model: Model, batch: torch.Tensor, layers: list[Layer], acts: bool, sinks: bool
) -> Captured:
    """Run ``batch`` and keep, per layer, the site's tokens (``acts``), the rule site's norms and
    (``sinks``) each key's sink-head count; the forward stops after the last site needed."""
    got = Captured({}, {}, {})
    hooks: dict[str, list[HookBody]] = {}

    def on(name: str, fn: HookBody) -> None:
        hooks.setdefault(name, []).append(fn)

    for layer in layers:
        key = layer.key
        if acts:
            on(
                layer.site,
                lambda t, ctx, key=key: got.acts.__setitem__(key, as_tokens(t).detach().cpu()),
            )
        on(
            layer.rule_site,
            lambda t, ctx, key=key: got.rule_norms.__setitem__(key, token_norms(t).cpu()),
        )
        if sinks and layer.pattern_site is not None:
            on(
                layer.pattern_site,
                lambda t, ctx, key=key: got.sinks.__setitem__(key, sink_counts(t)),
            )

    def fan(fns: list[HookBody]) -> HookBody:  # one torch hook per site, feeding each role
        def fn(t: torch.Tensor, ctx: HookContext) -> None:
            if got.layout is None and ctx.layout is not None and ctx.name != "":
                got.layout = ctx.layout
            for f in fns:
                f(t, ctx)

        return fn

    with torch.no_grad():
        model.run_with_hooks(
            batch,
            [(name, fan(fns)) for name, fns in hooks.items()],
            stop_at_layer=model.stop_layer(list(hooks)),
        )
    return got


def fit_rules(
    layers: list[Layer], norms: dict[str, list[torch.Tensor]], n: int
) -> dict[str, OutlierRule]:
    """Diagnose's bimodal outlier rule per layer, fitted on the patch norms of its rule site
    over ``n`` images."""
    rules = {}
    for layer in layers:
        fit = bimodal_fit(torch.cat(norms[layer.key]).numpy().ravel())
        cut = float(fit.cut) if fit.present else None
        rules[layer.key] = OutlierRule(
            site=layer.rule_site, cut=cut, bimodal=fit.present, n_images=n
        )
    return rules


def numbered(source: Iterable[torch.Tensor], names: Names, shard_size: int) -> Iterator[Part]:
    """The source's batches as parts that each lie inside one shard (a batch across a shard
    boundary is split)."""
    start = 0
    for batch in source:
        n = batch.shape[0]
        batch_names = names(start, n)
        i = 0
        while i < n:
            shard = (start + i) // shard_size
            end = min(n, (shard + 1) * shard_size - start)
            yield Part(shard, start + i, batch[i:end], batch_names[i:end])
            i = end
        start += n


@dataclass
class Part:
    """Images of one shard, in stream order: the shard, the first image's index, the images and
    their names."""

    number: int
    first: int
    images: torch.Tensor
    names: list[str]

    @property
    def end(self) -> int:
        return self.first + self.images.shape[0]


@dataclass
class Labelled:
    """A part forwarded and labelled: per layer its tokens' labels and (zarr) patch grids."""

    part: Part
    layers: dict[str, LayerBatch]
    grids: dict[str, torch.Tensor]
    saev: dict[str, torch.Tensor] | None = None  # float32 [B, 1 + patches, D]: [CLS] first


class ShardLoop:
    """This rank's shards, filled part by part and written when full; the shards a killed run
    finished are read back instead of computed again."""

    def __init__(
        self,
        model: Model,
        plan: Plan,
        out: Path,
        rank: int = 0,
        world: int = 1,
        on_shard: Callable[[ShardInfo], None] | None = None,
    ) -> None:
        self.model, self.plan, self.out = model, plan, out
        self.rank, self.world, self.on_shard = rank, world, on_shard
        self.done: dict[int, ShardInfo] = {}
        self.kept: list[str] = []  # files of the shards an earlier run finished
        self.current: Shard | None = None
        self.seen = 0  # images of the stream so far, this rank's or not
        self._positions: Positions | None = None

    def positions(self, layout: TokenLayout) -> Positions:
        """The exported positions of the run's ``layout`` (one layout a run: built once)."""
        if self._positions is None:
            self._positions = Positions.of(layout, self.plan.kinds)
        return self._positions

    def needs(self, part: Part) -> bool:
        """Whether this rank must compute ``part`` (its shard, not finished by an earlier run)."""
        number = part.number
        self.seen = max(self.seen, part.end)
        if number % self.world != self.rank:
            return False
        open_here = self.current is not None and self.current.number == number
        if number not in self.done and not open_here:
            found = read_info(self.out / shard_name(number))
            if found is not None and found.first_image == part.first:
                self.done[number] = found
                self.kept.append(found.file)
        return open_here or number not in self.done

    def label(self, part: Part, layout: TokenLayout, cuts: dict[str, float | None]) -> Labelled:
        """Forward ``part`` and label its tokens by the layers' outlier ``cuts``."""
        got = forward(self.model, part.images, self.plan.layers, acts=True, sinks=True)
        return self.labelled(part, got, layout, cuts)

    def labelled(
        self,
        part: Part,
        got: Captured,
        layout: TokenLayout,
        cuts: dict[str, float | None] | None = None,
    ) -> Labelled:
        """``part``'s tokens labelled from its forward ``got`` (no ``cuts`` yet: no outliers
        flagged until :func:`flag_outliers`)."""
        plan = self.plan
        positions = self.positions(layout)
        layers = {
            layer.key: label_layer(
                got.acts[layer.key],
                got.rule_norms[layer.key],
                got.sinks.get(layer.key),
                positions,
                None if cuts is None else cuts[layer.key],
                plan.dtype,
            )
            for layer in plan.layers
        }
        if plan.lof:
            for layer in plan.layers:
                lb = layers[layer.key]
                lb.lof, lb.lof_score = lof_labels(got.acts[layer.key], layout, positions)
        grids = {}
        if "zarr" in plan.formats:
            grids = {
                layer.key: layout.patch_grid(got.acts[layer.key]).to(plan.dtype)
                for layer in plan.layers
            }
        saev = None
        if "saev" in plan.formats:
            saev = {layer.key: saev_tokens(got.acts[layer.key], layout) for layer in plan.layers}
        return Labelled(part, layers, grids, saev)

    def add(self, done: Labelled, positions: Positions) -> None:
        """Add a labelled part to its shard; write the shard once it is full."""
        number = done.part.number
        if self.current is None or self.current.number != number:
            self.close()
            self.current = Shard(number, done.part.first, positions, self.plan.exclude)
        self.current.add(list(done.part.names), done.layers, done.grids, done.saev)
        if len(self.current.names) == self.plan.shard_size:
            self.close()

    def close(self) -> None:
        """Write the open shard (if any)."""
        current, self.current = self.current, None
        if current is not None and current.names:
            info = current.write(self.out, self.plan.formats, self.plan.dtype, self.plan.shard_size)
            self.done[current.number] = info
            if self.on_shard is not None:
                self.on_shard(info)

    def finished(self) -> list[ShardInfo]:
        """The finished shards this rank holds (read back or written), in order."""
        self.close()
        return [self.done[k] for k in sorted(self.done)]


def calibrate(
    loop: ShardLoop, parts: Iterator[Part], n: int, progress: Update | None = None
) -> tuple[Calibration, list[Labelled]]:
    """Fit each layer's outlier rule on the first ``n`` images of ``parts`` (every rank fits
    the same images, so the same cut everywhere); the parts this rank exports among them come
    back labelled, their forward not repeated."""
    layers = loop.plan.layers
    norms: dict[str, list[torch.Tensor]] = {layer.key: [] for layer in layers}
    held: list[Labelled] = []
    layout: TokenLayout | None = None
    d, seen = 0, 0
    for part in parts:
        mine = loop.needs(part)
        # every rank forwards the window as the exporting rank does: the same norms, one cut
        got = forward(loop.model, part.images, layers, acts=True, sinks=True)
        if layout is None:
            layout, d = got.layout, next(iter(got.acts.values())).shape[-1]
        assert layout is not None
        take = min(part.images.shape[0], n - seen)
        for layer in layers:
            norms[layer.key].append(layout.take(got.rule_norms[layer.key][:take], "patches"))
        if mine:
            held.append(loop.labelled(part, got, layout))
        seen += take
        if progress is not None:
            progress(loop.seen)
        if seen >= n:
            break
    assert layout is not None, "calibrate needs at least one image"
    return Calibration(fit_rules(layers, norms, seen), layout, d), held


def flag_outliers(
    held: list[Labelled], rules: dict[str, OutlierRule], positions: Positions
) -> None:
    """Flag the outliers of parts labelled before the rules were fitted."""
    for done in held:
        for key, lb in done.layers.items():
            lb.outlier = outlier_flags(lb.rule_norm, positions, rules[key].cut)


def saev_tokens(acts: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """``[B, 1 + patches, D]`` float32 as saev reads a ViT: the first [CLS] token (zeros for a
    model without one), then the patches in grid order."""
    patches = layout.take(acts, "patches").float()
    cls = acts[:, :1].float() if layout.n_cls else torch.zeros_like(patches[:, :1])
    return torch.cat([cls, patches], 1)
