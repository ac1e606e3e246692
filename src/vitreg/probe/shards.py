"""One cache shard: samples ``start..stop`` of a dataset, run in batches, saved as one safetensors file.

Tensors are named ``{hook name}/{view}``, ``target/{label|mask|depth}`` and
``pixels@{ph}x{pw}``; the string metadata holds the cache key, the shard's sample keys, its
skipped samples, boxes (ragged, JSON) and the layouts seen at each hook, and the SHA-256 of
the tensor bytes. Files are written atomically, so a shard file that opens is complete; one
damaged later (even in place, at the same size) no longer matches its checksum and is extracted
again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as save_tensors

from vitreg.core.io import write_bytes_atomic
from vitreg.core.layout import TokenLayout
from vitreg.data.datasets import DataLog, LabeledDataset, SkipSample
from vitreg.data.transforms import prepare
from vitreg.errors import InputError
from vitreg.models.model import Model
from vitreg.probe.shard_check import MALFORMED, MISMATCHED, meta_problem
from vitreg.probe.views import NORMS, TOP_INDEX, patch_pixels, reducer, unpack
from vitreg.progress import Update

MANIFEST = "manifest.json"


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.safetensors"


def pixels_key(layout: TokenLayout) -> str:
    """Tensor name of the input pixels under the tokens of a layout's patch size."""
    ph, pw = layout.patch_size
    return f"pixels@{ph}x{pw}"


def shard_meta(path: Path) -> dict[str, str] | None:
    """Metadata of a shard file, or None if it is missing or unreadable."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except Exception:  # a damaged file is extracted again, never read
        return None


# why an existing shard file is extracted again (counted in the manifest's ``replaced``)
REPLACED = (
    "checksum mismatch",
    "unreadable",
    "not this cache's shard",
    "no checksum (older cache)",
    MALFORMED,
    MISMATCHED,
)


def _data_digest(blob: bytes) -> str:
    """SHA-256 of a safetensors file's tensor bytes (everything after its header)."""
    size = int.from_bytes(blob[:8], "little")
    return hashlib.sha256(memoryview(blob)[8 + size :]).hexdigest()


def tensor_shapes(path: Path) -> dict[str, list[int]] | None:
    """Shape of every tensor in a shard file (read from its header), or None if unreadable."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except Exception:  # a damaged file is extracted again, never read
        return None


def shard_problem(path: Path, key: str, index: int, span: tuple[int, int]) -> str | None:
    """Why ``path`` is not an intact shard ``index`` (samples ``span``) of the cache ``key``:
    ``"missing"``, one of :data:`REPLACED`, or None when it is (its tensor bytes match the
    checksum it was saved with, its metadata has the writer's types and agrees with its
    tensors)."""
    if not path.exists():
        return "missing"
    meta = shard_meta(path)
    if meta is None:
        return "unreadable"
    if meta.get("key") != key or meta.get("index") != str(index):
        return "not this cache's shard"
    if "sha256" not in meta:
        return "no checksum (older cache)"
    try:
        blob = path.read_bytes()
    except OSError:
        return "unreadable"
    if _data_digest(blob) != meta["sha256"]:
        return "checksum mismatch"
    shapes = tensor_shapes(path)
    return "unreadable" if shapes is None else meta_problem(meta, shapes, *span)


def with_checksum(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> bytes:
    """The safetensors file of ``tensors`` whose metadata also holds the SHA-256 of its tensor
    bytes (their layout does not depend on the metadata, so the digest of a first encoding
    holds for the second)."""
    digest = _data_digest(save_tensors(tensors, metadata=meta))
    return save_tensors(tensors, metadata={**meta, "sha256": digest})


@dataclass
class ShardWriter:
    """Extracts shards of ``dataset`` at hooks ``names``; counts the forward passes it runs."""

    model: Model
    dataset: LabeledDataset
    names: Sequence[str]
    views: Sequence[str]
    key: str
    input: dict[str, int | list[float]]  # {"size", "mean", "std"} for :func:`prepare`
    batch_size: int
    dtype: torch.dtype
    pixels: bool
    progress: Update | None = None
    forward_passes: int = 0
    done: int = 0
    _parts: dict[str, list[torch.Tensor]] = field(default_factory=dict, repr=False)
    _layouts: dict[str, dict] = field(default_factory=dict, repr=False)

    def write(self, path: Path, index: int, start: int, stop: int) -> None:
        """Extract samples ``start..stop`` (bad ones skipped and listed, repaired pixels counted)
        into shard ``path``."""
        self._parts, self._layouts = {}, {}
        keys: list[str] = []
        boxes: list[list[list[float]]] = []
        skipped: list[dict[str, Any]] = []
        outer, self.dataset.log = self.dataset.log, DataLog()  # this shard's counts alone
        try:
            self._read(range(start, stop), keys, boxes, skipped)
            repairs = self.dataset.log.to_dict()
        finally:
            self.dataset.log = outer
        for item in skipped:
            repairs.pop(item["reason"], None)
        tensors = {k: torch.cat(v).contiguous() for k, v in self._parts.items()}
        meta = {
            "key": self.key,
            "index": str(index),
            "start": str(start),
            "stop": str(stop),
            "n": str(len(keys)),
            "keys": json.dumps(keys),
            "skipped": json.dumps(skipped),
            "repairs": json.dumps(repairs),
            "boxes": json.dumps(boxes if "boxes" in self.dataset.targets else None),
            "layouts": json.dumps(self._layouts),
        }
        write_bytes_atomic(path, with_checksum(tensors, meta))

    def _read(self, indices: range, keys: list, boxes: list, skipped: list) -> None:
        """Read, prepare and run the samples at ``indices`` batch by batch."""
        batch: list[dict[str, Any]] = []
        for i in indices:
            try:
                sample = self.dataset[i]
            except SkipSample as e:
                skipped.append({"index": i, "key": e.key, "reason": e.reason})
                continue
            item = prepare(sample, self.input["size"], self.input["mean"], self.input["std"])
            keys.append(sample.key)
            if "boxes" in self.dataset.targets:
                boxes.append(torch.as_tensor(self._need(item, "boxes")).reshape(-1, 4).tolist())
            batch.append(item)
            if len(batch) == self.batch_size:
                self._run(batch)
                batch = []
        if batch:
            self._run(batch)

    def _add(self, name: str, t: torch.Tensor) -> None:
        self._parts.setdefault(name, []).append(t)

    def _run(self, batch: list[dict[str, Any]]) -> None:
        """One forward pass; only the packed views of each hook leave the model."""
        x = torch.stack([item["image"] for item in batch])
        specs: dict[str, list] = {}
        reduce = reducer(self.views, specs)
        names = list(self.names)
        # blocks after the deepest requested layer feed no view: they are not run
        stop = self.model.stop_layer(names)
        _, cache = self.model.run_with_cache(x, names=names, reduce=reduce, stop_at_layer=stop)
        self.forward_passes += 1
        for name in self.names:
            self._layouts[name] = cache.layout(name).to_dict()
            for view, t in unpack(cache[name], specs[name]).items():
                self._add(f"{name}/{view}", t if view in (NORMS, TOP_INDEX) else t.to(self.dtype))
        if self.pixels:
            by_size = {pixels_key(cache.layout(n)): cache.layout(n) for n in self.names}
            for key, layout in by_size.items():
                self._add(key, patch_pixels(x.float(), layout).to(self.dtype))
        for target in self.dataset.targets:
            if target != "boxes":
                self._add(f"target/{target}", self._target(batch, target))
        self.done += len(batch)
        if self.progress is not None:
            self.progress(self.done)

    def _need(self, item: dict[str, Any], target: str) -> Any:
        if item.get(target) is None:
            raise InputError(
                f"sample {item.get('key')!r} has no {target!r} though the dataset lists it in "
                f"its targets {self.dataset.targets}; fix the dataset's targets or the sample"
            )
        return item[target]

    def _target(self, batch: list[dict[str, Any]], target: str) -> torch.Tensor:
        values = torch.stack([torch.as_tensor(self._need(item, target)) for item in batch])
        if target == "depth":
            return values.float()
        small = target == "mask" and (self.dataset.num_classes or 256) <= 255
        return values.to(torch.uint8 if small else torch.int64)
