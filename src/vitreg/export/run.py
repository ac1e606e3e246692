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
from vitreg.export.labels import Positions, label_layer, sink_counts
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


def calibrate(
    model: Model, source: Iterable[torch.Tensor], layers: list[Layer], n: int, batch_size: int
) -> Calibration:
    """Fit diagnose's bimodal outlier rule on the patch norms of each layer's rule site over
    the first ``n`` images (every rank fits the same images: the same cut everywhere)."""
    norms: dict[str, list[torch.Tensor]] = {layer.key: [] for layer in layers}
    layout, d, seen = None, 0, 0
    for batch in source:
        batch = batch[: n - seen]
        got = forward(model, batch, layers, acts=not d, sinks=False)
        if not d:
            d = next(iter(got.acts.values())).shape[-1]
            layout = got.layout
        for layer in layers:
            norms[layer.key].append(layout.take(got.rule_norms[layer.key], "patches"))
        seen += batch.shape[0]
        if seen >= n:
            break
    rules = {}
    for layer in layers:
        patch = torch.cat(norms[layer.key]).numpy().ravel()
        fit = bimodal_fit(patch)
        cut = float(fit.cut) if fit.present else None
        rules[layer.key] = OutlierRule(
            site=layer.rule_site, cut=cut, bimodal=fit.present, n_images=seen
        )
    assert layout is not None
    return Calibration(rules, layout, d)


def numbered(
    source: Iterable[torch.Tensor], names: Names, shard_size: int
) -> Iterator[tuple[int, int, torch.Tensor, list[str]]]:
    """``(shard, first image, images, names)`` parts of the source's batches, each inside one
    shard (a batch across a shard boundary is split)."""
    start = 0
    for batch in source:
        n = batch.shape[0]
        batch_names = names(start, n)
        i = 0
        while i < n:
            shard = (start + i) // shard_size
            end = min(n, (shard + 1) * shard_size - start)
            yield shard, start + i, batch[i:end], batch_names[i:end]
            i = end
        start += n


def export_images(
    model: Model,
    source: Iterable[torch.Tensor],
    names: Names,
    plan: Plan,
    cal: Calibration,
    out: Path,
    rank: int = 0,
    world: int = 1,
    progress: Update | None = None,
    on_shard: Callable[[ShardInfo], None] | None = None,
) -> tuple[list[ShardInfo], int, list[str]]:
    """Export this rank's shards; the finished shards it holds (read back or written), how
    many images the source had and the files of the shards kept from an earlier run."""
    positions = Positions.of(cal.layout, plan.kinds)
    cuts = {key: rule.cut for key, rule in cal.rules.items()}
    done: dict[int, ShardInfo] = {}
    kept: list[str] = []
    current: Shard | None = None
    seen = 0

    def close() -> None:
        nonlocal current
        if current is not None and current.names:
            info = current.write(out, plan.formats, plan.dtype)
            done[current.number] = info
            if on_shard is not None:
                on_shard(info)
        current = None

    for number, first, images, batch_names in numbered(source, names, plan.shard_size):
        seen = first + images.shape[0]
        if number % world != rank:
            continue
        if number not in done:
            found = (
                read_info(out / shard_name(number))
                if current is None or current.number != number
                else None
            )
            if found is not None and found.first_image == first:
                done[number] = found
                kept.append(found.file)
        if number in done and (current is None or current.number != number):
            continue
        if current is None or current.number != number:
            close()
            current = Shard(number, first, positions, plan.exclude)
        got = forward(model, images, plan.layers, acts=True, sinks=True)
        batch = {
            layer.key: label_layer(
                got.acts[layer.key],
                got.rule_norms[layer.key],
                got.sinks.get(layer.key),
                positions,
                cuts[layer.key],
                plan.dtype,
            )
            for layer in plan.layers
        }
        grids = {}
        if "zarr" in plan.formats:
            grids = {
                layer.key: cal.layout.patch_grid(got.acts[layer.key]).to(plan.dtype)
                for layer in plan.layers
            }
        current.add(list(batch_names), batch, grids)
        if len(current.names) == plan.shard_size:
            close()
        if progress is not None:
            progress(seen)
    close()
    if progress is not None:  # every image of the stream, this rank's or not
        progress(seen)
    return [done[k] for k in sorted(done)], seen, kept
