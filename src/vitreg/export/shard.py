"""One shard of an export, filled batch by batch and written once full: the activations of each
layer and the table of its tokens, in every chosen format (the safetensors file last: its
presence says the shard is finished)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitreg.export.formats import write_grids, write_parquet, write_saev, write_safetensors
from vitreg.export.labels import LayerBatch, Positions
from vitreg.export.sites import KIND_CODES
from vitreg.results.export import ShardInfo


def shard_name(number: int) -> str:
    return f"shard-{number:05d}.safetensors"


def read_info(path: Path) -> ShardInfo | None:
    """The description a finished shard carries (``None``: not there or not one of ours)."""
    from safetensors import safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get("vitreg")
    except Exception:  # noqa: BLE001 - a damaged shard is redone, not trusted
        return None
    return None if meta is None else ShardInfo.model_validate_json(meta)


@dataclass
class Shard:
    """The images of one shard so far, by layer (their labels at the exported positions)."""

    number: int
    first: int
    positions: Positions
    exclude: list[str]
    names: list[str] = field(default_factory=list)
    layers: dict[str, list[LayerBatch]] = field(default_factory=dict)
    grids: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    saev: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # [CLS] + patches

    def add(
        self,
        names: list[str],
        batch: dict[str, LayerBatch],
        grids: dict[str, torch.Tensor],
        saev: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.names += names
        for key, lb in batch.items():
            self.layers.setdefault(key, []).append(lb)
        for key, g in grids.items():
            self.grids.setdefault(key, []).append(g)
        for key, t in (saev or {}).items():
            self.saev.setdefault(key, []).append(t)

    def write(
        self, out: Path, formats: list[str], dtype: torch.dtype, shard_size: int
    ) -> ShardInfo:
        """Write the shard in every format (a saev shard is ``shard_size`` images long); its
        description (as the index lists it)."""
        n = len(self.names)
        tensors: dict[str, torch.Tensor] = {}
        table = self._table(n)
        info = ShardInfo(
            file=shard_name(self.number),
            first_image=self.first,
            n_images=n,
            names=self.names,
            rows={},
        )
        for key, parts in self.layers.items():
            lb = _cat(parts)
            keep = lb.keep(self.exclude)
            rows = torch.arange(keep.numel()).reshape(keep.shape)[keep]
            tensors[f"{key}.activations"] = lb.acts[keep].to(dtype)
            tensors[f"{key}.rows"] = rows
            tensors[f"{key}.norm"] = lb.norm.reshape(-1)
            tensors[f"{key}.rule_norm"] = lb.rule_norm.reshape(-1)
            tensors[f"{key}.outlier"] = lb.outlier.reshape(-1)
            tensors[f"{key}.sink_heads"] = lb.sink_heads.reshape(-1)
            tensors[f"{key}.kept"] = keep.reshape(-1)
            info.rows[key] = int(keep.sum())
            info.outliers[key] = int(lb.outlier.sum())
            info.sink_keys[key] = int(lb.sink_heads.sum())
            info.excluded[key] = _excluded(lb, self.exclude)
            columns = ["norm", "rule_norm", "outlier", "sink_heads", "kept"]
            if lb.lof is not None and lb.lof_score is not None:
                tensors[f"{key}.lof"] = lb.lof.reshape(-1)
                tensors[f"{key}.lof_score"] = lb.lof_score.reshape(-1)
                info.lof[key] = int(lb.lof.sum())
                columns += ["lof", "lof_score"]
            for col in columns:
                table[f"{col}_{key}"] = tensors[f"{key}.{col}"].numpy()
        for col in ("image", "token", "kind", "row", "col"):
            tensors[f"tokens.{col}"] = torch.from_numpy(np.asarray(table[col]))
        written = 0
        stem = info.file.removesuffix(".safetensors")
        if "zarr" in formats:
            write_grids(out, self.first, {k: torch.cat(v) for k, v in self.grids.items()})
        if "saev" in formats:
            acts = np.stack([torch.cat(v).numpy() for v in self.saev.values()], axis=1)
            written += write_saev(out, self.number, acts, shard_size)
        if "parquet" in formats:
            names = np.asarray(self.names, dtype=object)
            table["file"] = names[table["image"] - self.first]
            table["kind"] = np.asarray(KIND_CODES, dtype=object)[table["kind"]]
            written += write_parquet(out / "tokens" / f"{stem}.parquet", table)
            written += write_parquet(out / "images" / f"{stem}.parquet", self._images(n))
        info.bytes = written + sum(t.numel() * t.element_size() for t in tensors.values())
        write_safetensors(out / info.file, tensors, info.model_dump_json())
        return info

    def _table(self, n: int) -> dict[str, np.ndarray]:
        """The token table's label columns: one row per (image, exported position)."""
        p = self.positions
        k = p.index.numel()
        image = np.repeat(np.arange(self.first, self.first + n, dtype=np.int64), k)
        return {
            "image": image,
            "token": np.tile(p.index.numpy().astype(np.int32), n),
            "kind": np.tile(p.kind.numpy(), n),
            "row": np.tile(p.row.numpy(), n),
            "col": np.tile(p.col.numpy(), n),
        }

    def _images(self, n: int) -> dict[str, np.ndarray | list[str]]:
        """The image table: per image its file and, per layer, the first [CLS] token and the
        mean patch token (float32 vectors)."""
        cols: dict[str, np.ndarray | list[str]] = {
            "image": np.arange(self.first, self.first + n, dtype=np.int64),
            "file": list(self.names),
        }
        cls_at = (self.positions.kind == KIND_CODES.index("cls")).nonzero().flatten()
        for key, parts in self.layers.items():
            acts = torch.cat([lb.acts for lb in parts]).float()
            if cls_at.numel():
                cols[f"cls_{key}"] = acts[:, int(cls_at[0])].numpy()
            if self.positions.patch.any():
                cols[f"mean_patch_{key}"] = acts[:, self.positions.patch].mean(1).numpy()
        return cols


def _cat(parts: list[LayerBatch]) -> LayerBatch:
    fields = ("acts", "norm", "rule_norm", "outlier", "sink_heads")
    lb = LayerBatch(*(torch.cat([getattr(p, f) for p in parts]) for f in fields))
    if parts[0].lof is not None:
        lb.lof = torch.cat([p.lof for p in parts if p.lof is not None])
        lb.lof_score = torch.cat([p.lof_score for p in parts if p.lof_score is not None])
    return lb


def _excluded(lb: LayerBatch, exclude: list[str]) -> dict[str, list[int]]:
    """Tokens each ``--exclude`` rule flags, per image."""
    out = {}
    if "outliers" in exclude:
        out["outliers"] = lb.outlier.sum(1).tolist()
    if "sinks" in exclude:
        out["sinks"] = (lb.sink_heads > 0).sum(1).tolist()
    return out
