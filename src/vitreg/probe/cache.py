"""Feature cache: extract token views once, store safetensors shards + a manifest, reuse, resume.

``extract(model, dataset, root=...)`` writes ``root/<key>/shard-00000.safetensors ...`` and
``manifest.json``. The key hashes everything the features depend on, so a changed model, fix,
dataset, layer or view list gets its own folder. Every file is written atomically (temporary
file + rename), so an interrupted run leaves only complete shards; the next run reuses them and
extracts the rest. Under ``torchrun`` rank ``r`` extracts shards ``i % world == r`` and rank 0
writes the manifest after a barrier.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import JsonValue

from vitreg import distributed
from vitreg.core.containment import check_inside
from vitreg.core.disk import remove_file
from vitreg.core.io import write_json_atomic
from vitreg.core.layout import TokenLayout
from vitreg.data.datasets import LabeledDataset
from vitreg.data.transforms import model_input
from vitreg.errors import InputError, VitregError
from vitreg.fix.base import Fix
from vitreg.fix.neuron_set import weights_fingerprint
from vitreg.models.model import Model
from vitreg.probe.cache_files import (
    CacheIdentity,
    CacheManifest,
    FixIdentity,
    ShardEntry,
)
from vitreg.probe.features import CachedFeatures
from vitreg.probe.shards import (
    MANIFEST,
    REPLACED,
    ShardWriter,
    shard_meta,
    shard_name,
    shard_problem,
)
from vitreg.probe.views import absent_views, check_views
from vitreg.progress import Update
from vitreg.results.fix import NamedFix

FORMAT = 1
FINAL = "ln_final.hook_out"
BLOCK_OUTPUT = "hook_resid_post"


@dataclass
class Plan:
    """What one extraction computes: hook names (with the request each came from) and views."""

    names: list[str]
    requests: list[int | str]
    views: list[str]
    absent: dict[str, dict[str, str]]  # hook name -> {view: reason}
    layouts: dict[str, TokenLayout]  # static layouts (prefix counts right; grids from the hooks)


def resolve_layers(model: Model, layers: Sequence[int | str]) -> list[str]:
    """Hook names for ``layers``: ints index the block outputs, ``"final"`` is the final norm."""
    blocks = [n for n in model.hook_names() if n.endswith(BLOCK_OUTPUT)]
    names: list[str] = []
    for layer in layers:
        if isinstance(layer, int):
            if not -len(blocks) <= layer < len(blocks):
                raise InputError(
                    f"layer {layer} is out of range: this model has {len(blocks)} blocks "
                    f"(use 0..{len(blocks) - 1}, negatives from the end, 'final' or a hook name)"
                )
            name = blocks[layer]
        else:
            name = FINAL if layer == "final" else model.site(layer).name
        if name in names:
            raise InputError(f"layer {layer!r} repeats {name!r}; list each layer once")
        names.append(name)
    if not names:
        raise InputError("no layers given; e.g. layers=(-1,) for the last block")
    return names


def make_plan(model: Model, layers: Sequence[int | str], views: Sequence[str]) -> Plan:
    """Resolve layers and views against the model as it is now (call inside the fix)."""
    names = resolve_layers(model, layers)
    chosen = check_views(views)
    layouts: dict[str, TokenLayout] = {}
    absent: dict[str, dict[str, str]] = {}
    for name in names:
        layout = model.site(name).context(lambda: model.layout).layout
        if layout is None:
            raise InputError(f"{name!r} is not a token sequence; pick a block output or 'final'")
        layouts[name] = layout
        absent[name] = absent_views(layout, chosen)
        if len(absent[name]) == len(chosen):
            reasons = "; ".join(f"{v}: {r}" for v, r in absent[name].items())
            raise InputError(
                f"none of the views {chosen} exists at {name!r} ({reasons}); "
                "ask for a patch view such as 'patch_mean' or 'patches'"
            )
    return Plan(names, list(layers), chosen, absent, layouts)


def _as_hashed(value: Any) -> JsonValue:
    """``value`` as the cache key's JSON reads it (anything JSON does not hold as its text)."""
    return json.loads(json.dumps(value, default=str))  # type: ignore[no-any-return]


def describe_fix(fix: Fix | None) -> FixIdentity | None:
    """The fix's identity for the cache key: class, settings and, if any, its exact neurons."""
    if fix is None:
        return None
    said = fix.describe() if hasattr(fix, "describe") else {}
    settings = said.model_dump(exclude={"name"}) if isinstance(said, NamedFix) else said
    neurons = getattr(fix, "neurons", None)
    pairs = neurons.pairs() if neurons is not None and hasattr(neurons, "pairs") else None
    return FixIdentity(
        class_name=f"{type(fix).__module__}.{type(fix).__qualname__}",
        said=_as_hashed(settings),
        neurons=None if pairs is None else [list(p) for p in pairs],
    )


def input_config(model: Model, image_size: int | None = None) -> dict[str, int | list[float]]:
    """Input size (the model's default unless given) and normalisation of the samples."""
    size, mean, std = model_input(model)
    return {"size": image_size or size, "mean": list(mean), "std": list(std)}


def cache_identity(
    model: Model,
    dataset: LabeledDataset,
    plan: Plan,
    fix: Fix | None,
    dtype: torch.dtype,
    pixels: bool,
    shard_size: int,
    image_size: int | None = None,
) -> CacheIdentity:
    """Everything the cached tensors depend on (hashed into the folder name)."""
    return CacheIdentity(
        format=FORMAT,
        model=model.describe(),
        weights=weights_fingerprint(model.module),
        fix=describe_fix(fix),
        dataset=_as_hashed(dataset.describe()),
        targets=list(dataset.targets),
        layers=plan.names,
        views=plan.views,
        dtype=str(dtype).removeprefix("torch."),
        pixels=pixels,
        input=input_config(model, image_size),
        shard_size=shard_size,
    )


def cache_key(identity: CacheIdentity) -> str:
    """The folder name of a cache: a hash of its identity's JSON."""
    blob = json.dumps(identity.written(), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def check_same_key(key: str) -> None:
    """Every torchrun rank must extract the same thing (same weights, data, options)."""
    keys = distributed.all_gather(key)
    if len(set(keys)) > 1:
        raise InputError(
            f"the torchrun ranks would fill different feature caches ({sorted(set(keys))}): "
            "their models, data or options differ; load the same weights on every rank (seed "
            "random initialisation) and pass the same options"
        )


def extract(
    model: Model,
    dataset: LabeledDataset,
    *,
    layers: Sequence[int | str] = (-1,),
    views: Sequence[str] = ("cls", "reg", "extra", "patch_mean"),
    fix: Fix | None = None,
    root: str | Path,
    batch_size: int = 32,
    shard_size: int = 256,
    dtype: torch.dtype = torch.float16,
    pixels: bool = False,
    image_size: int | None = None,
    progress: Update | None = None,
) -> CachedFeatures:
    """Token views of every sample at ``layers`` (optionally under ``fix``), cached on disk.

    Views a site cannot give (no [CLS] on a Swin stage, no ``extra`` without a fix) are left out
    and listed in ``manifest.absent``. Samples are resized and centre-cropped to
    ``image_size`` (default: the model's own input size; models that take any size, such as
    PVT-v2, can be probed smaller). ``progress(n)`` gets the samples extracted so far.
    """
    if batch_size < 1 or shard_size < 1:
        raise InputError(f"batch_size and shard_size must be >= 1, got {batch_size}, {shard_size}")
    if len(dataset) == 0:
        raise InputError(f"the dataset {dataset.describe().get('spec')!r} has no samples")
    rank, size = distributed.rank(), distributed.world()
    model.eval()
    scope = fix.applied(model) if fix is not None else contextlib.nullcontext()
    with scope:
        plan = make_plan(model, layers, views)
        identity = cache_identity(model, dataset, plan, fix, dtype, pixels, shard_size, image_size)
        key = cache_key(identity)
        if size > 1:
            check_same_key(key)
        folder = Path(root) / key
        if folder.is_symlink():  # one containment rule: no link leads out
            check_inside(root, folder, "feature cache folder")
        n_shards = -(-len(dataset) // shard_size)
        writer = ShardWriter(
            model,
            dataset,
            plan.names,
            plan.views,
            key=key,
            input=identity.input,
            batch_size=batch_size,
            dtype=dtype,
            pixels=pixels,
            progress=progress,
        )
        replaced = torch.zeros(len(REPLACED), dtype=torch.long)
        for i in range(rank, n_shards, size):
            path = folder / shard_name(i)
            if path.is_symlink():  # one containment rule: no link leads out
                check_inside(folder, path, "feature cache shard")
            span = (i * shard_size, min(len(dataset), (i + 1) * shard_size))
            problem = shard_problem(path, key, i, span)
            if problem is None:
                continue
            if problem in REPLACED:  # a damaged shard is never read: it is extracted again
                replaced[REPLACED.index(problem)] += 1
            for stale in folder.glob(f".{path.name}.*.tmp"):  # left by a killed writer
                remove_file(stale)
            writer.write(path, i, i * shard_size, min(len(dataset), (i + 1) * shard_size))
    replaced = distributed.all_reduce_sum(replaced)
    counts = {r: int(n) for r, n in zip(REPLACED, replaced, strict=True) if n}
    distributed.barrier()  # every shard is written
    distributed.on_main(write_manifest, folder, identity, plan, key, n_shards, counts)
    return CachedFeatures(folder, forward_passes=writer.forward_passes)


def write_manifest(
    folder: Path,
    identity: CacheIdentity,
    plan: Plan,
    key: str,
    n_shards: int,
    replaced: dict[str, int] | None = None,
) -> CacheManifest:
    """Gather every shard's metadata into ``manifest.json`` (fails if a shard is missing);
    ``replaced``: shards this extraction wrote again because the file on disk was damaged, by
    reason."""
    shards: list[ShardEntry] = []
    skipped: dict[str, int] = {}
    repairs: dict[str, int] = {}  # pixels set to ignore / invalid, by reason
    layouts = {n: lay.to_dict() for n, lay in plan.layouts.items()}
    seen_layouts = False
    for i in range(n_shards):
        meta = shard_meta(folder / shard_name(i))
        if meta is None or meta.get("key") != key:
            raise VitregError(f"shard {i} of {folder} is missing; run extract again to finish it")
        dropped = json.loads(meta["skipped"])
        for reason, n in json.loads(meta.get("repairs", "{}")).items():
            repairs[reason] = repairs.get(reason, 0) + n
        for item in dropped:
            skipped[item["reason"]] = skipped.get(item["reason"], 0) + 1
        if int(meta["n"]) and not seen_layouts:
            layouts, seen_layouts = json.loads(meta["layouts"]), True
        shards.append(
            ShardEntry(
                file=shard_name(i),
                start=int(meta["start"]),
                stop=int(meta["stop"]),
                n=int(meta["n"]),
                skipped=dropped,
                sha256=meta.get("sha256"),
            )
        )
    manifest = CacheManifest(
        **dict(identity),
        key=key,
        requests=plan.requests,
        absent=plan.absent,
        layouts=layouts,
        n=sum(s.n for s in shards),
        n_skipped=sum(skipped.values()),
        skipped=skipped,
        repairs=repairs,
        replaced=replaced or {},
        shards=shards,
    )
    write_json_atomic(folder / MANIFEST, manifest.written())
    return manifest
