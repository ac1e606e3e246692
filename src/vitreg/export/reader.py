"""Reading an export back: :func:`open` gives a map-style torch ``Dataset`` of one layer's token
activations (with their labels) and, through :meth:`Exported.shards`, an ``IterableDataset``
that streams them shard by shard for a ``DataLoader``."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path
from typing import NotRequired, TypedDict

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from vitreg.errors import InputError
from vitreg.export.index import read_index
from vitreg.results.export import ExportIndex, ShardInfo

LABELS = ("image", "token", "kind", "row", "col")


class Token(TypedDict):
    """One exported token: its activation and labels."""

    activation: torch.Tensor
    image: int
    token: int
    kind: int
    row: int
    col: int
    norm: float
    outlier: bool
    sink_heads: int
    lof: NotRequired[bool]  # exports written with --lof
    lof_score: NotRequired[float]


def load_shard(folder: Path, info: ShardInfo, layer: str) -> dict[str, torch.Tensor]:
    """One shard's activations of ``layer`` and each row's labels (tensors)."""
    from safetensors.torch import load_file

    t = load_file(str(folder / info.file))
    rows = t[f"{layer}.rows"]
    out = {"activation": t[f"{layer}.activations"]}
    for name in LABELS:
        out[name] = t[f"tokens.{name}"][rows]
    for name in ("norm", "outlier", "sink_heads", "lof", "lof_score"):
        if f"{layer}.{name}" in t:
            out[name] = t[f"{layer}.{name}"][rows]
    return out


class ShardStream(IterableDataset):
    """The tokens of one layer, shard by shard (a ``DataLoader``'s workers take alternate
    shards); ``activations_only`` yields the activation tensors alone."""

    def __init__(
        self, folder: Path, shards: list[ShardInfo], layer: str, activations_only: bool
    ) -> None:
        self.folder, self.infos, self.layer = folder, shards, layer
        self.activations_only = activations_only

    def __iter__(self) -> Iterator[torch.Tensor | Token]:
        worker = get_worker_info()
        mine = self.infos if worker is None else self.infos[worker.id :: worker.num_workers]
        for info in mine:
            shard = load_shard(self.folder, info, self.layer)
            for i in range(shard["activation"].shape[0]):
                if self.activations_only:
                    yield shard["activation"][i]
                else:
                    yield _token(shard, i)


def _token(shard: dict[str, torch.Tensor], i: int) -> Token:
    token = Token(
        activation=shard["activation"][i],
        image=int(shard["image"][i]),
        token=int(shard["token"][i]),
        kind=int(shard["kind"][i]),
        row=int(shard["row"][i]),
        col=int(shard["col"][i]),
        norm=float(shard["norm"][i]),
        outlier=bool(shard["outlier"][i]),
        sink_heads=int(shard["sink_heads"][i]),
    )
    if "lof" in shard:
        token["lof"] = bool(shard["lof"][i])
        token["lof_score"] = float(shard["lof_score"][i])
    return token


class Exported(Dataset):
    """The tokens of one layer of an export, by position (the shards in order); ``index`` is
    the export's :class:`~vitreg.results.export.ExportIndex`."""

    def __init__(self, folder: Path, index: ExportIndex, layer: str) -> None:
        self.folder, self.index, self.layer = folder, index, layer
        self.starts = [0]
        for info in index.shards:
            self.starts.append(self.starts[-1] + info.rows[layer])
        self._cached: tuple[int, dict[str, torch.Tensor]] | None = None

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> Token:
        if not -len(self) <= i < len(self):
            raise IndexError(f"token {i} of an export of {len(self)}")
        i %= len(self)
        s = bisect.bisect_right(self.starts, i) - 1
        if self._cached is None or self._cached[0] != s:
            self._cached = (s, load_shard(self.folder, self.index.shards[s], self.layer))
        return _token(self._cached[1], i - self.starts[s])

    def shards(self, activations_only: bool = True) -> ShardStream:
        """An ``IterableDataset`` over the tokens, one shard in memory at a time."""
        return ShardStream(self.folder, self.index.shards, self.layer, activations_only)

    def activations(self) -> torch.Tensor:
        """Every row of the layer as one ``[rows, D]`` tensor (small exports only)."""
        return torch.cat(
            [load_shard(self.folder, s, self.layer)["activation"] for s in self.index.shards]
        )


def open(folder: str | Path, layer: str | int | None = None, partial: bool = False) -> Exported:  # noqa: A001
    """The export in ``folder``, one layer's tokens (default: the first exported); an export
    still running or stopped is refused unless ``partial`` (its finished shards)."""
    folder = Path(folder)
    index = read_index(folder)
    if index is None:
        raise InputError(f"{str(folder)!r} holds no index.json: not a `vitreg export` folder")
    if not index.complete and not partial:
        raise InputError(
            f"the export in {str(folder)!r} is not finished ({len(index.shards)} shards so "
            "far); rerun the same command to resume it, or open(..., partial=True)"
        )
    keys = index.settings.layers
    key = keys[0] if layer is None else str(layer)
    if key not in keys:
        raise InputError(f"layer {layer!r} was not exported; the export has {keys}")
    return Exported(folder, index, key)


__all__ = ["Exported", "ShardStream", "Token", "open"]
