"""One export, start to end: the run's outlier rules (read back on a resume), every rank's
shards, then the index of all of them and the grids cut to the images written."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from vitreg import distributed
from vitreg.export.formats import (
    SAEV,
    create_grids,
    finish_grids,
    saev_name,
    write_saev_metadata,
)
from vitreg.export.index import check_resume, read_index, write_index
from vitreg.export.run import (
    Calibration,
    Labelled,
    Names,
    Plan,
    ShardLoop,
    calibrate,
    flag_outliers,
    numbered,
)
from vitreg.export.shard import read_info, shard_name
from vitreg.export.sites import KIND_CODES
from vitreg.models.model import Model
from vitreg.progress import Update
from vitreg.results.export import ExportIndex, ExportSettings, LayoutInfo, ShardInfo


@dataclass
class Written:
    """What an export wrote: its index, the files of the shards an earlier run had finished,
    the seconds this run took."""

    index: ExportIndex
    resumed: list[str]
    seconds: float


def _calibration(index: ExportIndex) -> Calibration:
    from vitreg.core.layout import TokenLayout

    lay = index.layout
    layout = TokenLayout(lay.n_cls, lay.n_reg, tuple(lay.grid), tuple(lay.patch_size), lay.n_extra)
    return Calibration(dict(index.outlier_rules), layout, index.d_model)


def begin(
    out: Path,
    source: Iterable[torch.Tensor],
    plan: Plan,
    settings: ExportSettings,
    cal: Calibration,
) -> ExportIndex:
    """A new run's index: the fitted outlier rules, the layout and width; rank 0 creates the
    grids and writes it before any shard."""
    lay = cal.layout
    index = ExportIndex(
        settings=settings,
        layout=LayoutInfo(
            n_cls=lay.n_cls,
            n_reg=lay.n_reg,
            n_extra=lay.n_extra,
            grid=list(lay.grid),
            patch_size=list(lay.patch_size),
            n_tokens=lay.n_tokens,
        ),
        d_model=cal.d_model,
        token_kinds=list(KIND_CODES),
        outlier_rules=cal.rules,
        shards=[],
    )
    if distributed.is_main():  # the grids first: an index on disk means they are there
        if "zarr" in plan.formats:
            keys = [layer.key for layer in plan.layers]
            capacity = max(getattr(source, "total", 0) or 0, 1)
            create_grids(out, keys, capacity, lay.grid, cal.d_model, plan.shard_size, plan.dtype)
        write_index(out, index)
    distributed.barrier()
    return index


def export(
    out: Path,
    model: Model,
    source: Iterable[torch.Tensor],
    names: Names,
    plan: Plan,
    settings: ExportSettings,
    progress: Update | None = None,
) -> Written:
    """Export ``source``'s images into ``out`` (resuming the shards an earlier run of the same
    settings finished); every rank returns the complete index. A new run fits its outlier rules
    on the first ``settings.calibration`` images within the export's own pass."""
    began = time.perf_counter()
    found = read_index(out)
    check_resume(found, settings)
    distributed.barrier()  # every rank has read the folder before rank 0 writes into it
    rank, world = distributed.rank(), distributed.world()
    loop = ShardLoop(model, plan, out, rank, world)
    parts = numbered(source, names, plan.shard_size)
    held: list[Labelled] = []
    if found is None:
        cal, held = calibrate(loop, parts, settings.calibration, progress)
        flag_outliers(held, cal.rules, loop.positions(cal.layout))
        index = begin(out, source, plan, settings, cal)
    else:
        index, cal = found, _calibration(found)
    finished: dict[int, ShardInfo] = {}

    def on_shard(info: ShardInfo) -> None:  # one process: the index follows every shard
        if world == 1:
            number = int(info.file.removeprefix("shard-").removesuffix(".safetensors"))
            finished[number] = info
            partial = index.model_copy(update={"shards": [finished[k] for k in sorted(finished)]})
            write_index(out, partial)

    loop.on_shard = on_shard
    positions = loop.positions(cal.layout)
    cuts = {key: rule.cut for key, rule in cal.rules.items()}
    for done in held:
        loop.add(done, positions)
    for part in parts:
        if loop.needs(part):
            loop.add(loop.label(part, cal.layout, cuts), positions)
        if progress is not None:
            progress(loop.seen)
    mine, n_images, resumed = loop.finished(), loop.seen, loop.kept
    distributed.barrier()
    n_shards = math.ceil(n_images / plan.shard_size)
    shards = mine
    if world > 1:
        shards = [read_info(out / shard_name(s)) for s in range(n_shards)]
        resumed = sorted(f for files in distributed.all_gather(resumed) for f in files)
    complete = index.model_copy(update={"shards": shards, "complete": True, "n_images": n_images})
    if distributed.is_main():
        if world > 1:
            _adopt(out, shards, plan.formats)
        if "zarr" in plan.formats:
            finish_grids(out, [layer.key for layer in plan.layers], n_images)
        if "saev" in plan.formats:
            lay = cal.layout
            shape = (lay.n_patches, cal.d_model, lay.n_cls > 0)
            layers = [int(layer.key) for layer in plan.layers]
            write_saev_metadata(
                out, settings.spec, settings.images, layers, shape, n_images, plan.shard_size
            )
        write_index(out, complete)
    distributed.barrier()
    return Written(complete, resumed, time.perf_counter() - began)


def _adopt(out: Path, shards: list[ShardInfo | None], formats: list[str]) -> None:
    """Rank 0 records the files the other ranks wrote in the run folder's manifest."""
    from vitreg.core.run_dir import seal

    for info in shards:
        assert info is not None
        stem = info.file.removesuffix(".safetensors")
        files = [out / info.file]
        if "parquet" in formats:
            files += [out / "tokens" / f"{stem}.parquet", out / "images" / f"{stem}.parquet"]
        if "saev" in formats:
            files.append(out / SAEV / saev_name(int(stem.removeprefix("shard-"))))
        for path in files:
            seal(path)
    if "zarr" in formats:
        for path in sorted((out / "patches.zarr").rglob("*")):
            if path.is_file():
                seal(path)
