"""The files of an export, each written whole or not at all through vitreg's atomic writer (so
a run folder's manifest lists them and a killed run leaves no half file): safetensors shards,
parquet token and image tables (``pyarrow``), zarr patch grids (``zarr``), and the binary
shards with ``metadata.json`` that ``saev``'s activation reader maps."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitreg.core.io import write_bytes_atomic, write_json_atomic
from vitreg.errors import InputError

FORMATS = ("safetensors", "parquet", "zarr", "saev")
GRIDS = "patches.zarr"
SAEV = "saev"  # folder of the saev shards
#: torch dtype -> the dtype the zarr grids hold (numpy has no bfloat16)
ZARR_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "float32"}
EXTRA = "pip install 'vitreg[export]'"


def check_formats(formats: list[str]) -> None:
    """Known formats whose libraries are installed, checked before the model loads."""
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise InputError(f"--formats {bad or formats}: choose from {', '.join(FORMATS)}")
    for fmt, module in (("parquet", "pyarrow"), ("zarr", "zarr")):
        if fmt in formats:
            try:
                __import__(module)
            except ImportError:
                raise InputError(
                    f"--formats {fmt} needs the {module} package: {EXTRA}, or drop {fmt}"
                ) from None


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], meta: str) -> int:
    """One shard, its description (JSON text) in the file's metadata; the bytes written."""
    from safetensors.torch import save

    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata={"vitreg": meta})
    write_bytes_atomic(path, data)
    return len(data)


def write_parquet(path: Path, columns: dict[str, np.ndarray | list[str]]) -> int:
    """One parquet file of ``columns`` (name -> numpy array or list); the bytes written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({k: _column(v) for k, v in columns.items()})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    data = sink.getvalue()
    write_bytes_atomic(path, data)
    return len(data)


def _column(v: np.ndarray | list[str]) -> Any:
    """A pyarrow array: 2-d numbers become fixed-size lists (one vector per row)."""
    import pyarrow as pa

    if isinstance(v, np.ndarray) and v.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
    return pa.array(v)


def _atomic_store(root: Path) -> Any:
    """A zarr local store whose every key is written by vitreg's atomic writer."""
    from zarr.storage import LocalStore

    class AtomicStore(LocalStore):
        async def _set(self, key: str, value: Any, exclusive: bool = False) -> None:
            if not self._is_open:
                await self._open()
            self._check_writable()
            write_bytes_atomic(self.root / key, value.to_bytes())

    return AtomicStore(root)


def open_grids(root: Path) -> Any:
    """The zarr group of an export's patch grids, to write into."""
    import zarr

    return zarr.open_group(store=_atomic_store(root / GRIDS), mode="a")


def create_grids(
    root: Path,
    layers: list[str],
    capacity: int,
    grid: tuple[int, int],
    d: int,
    chunk: int,
    dtype: torch.dtype,
) -> None:
    """One ``[capacity, H, W, D]`` array per layer (chunks of one shard's images), unless there."""
    group = open_grids(root)
    h, w = grid
    for key in layers:
        if key not in group:
            group.create_array(
                key,
                shape=(capacity, h, w, d),
                chunks=(chunk, h, w, d),
                dtype=ZARR_DTYPES[dtype],
                fill_value=0,
            )


def write_grids(root: Path, first: int, grids: dict[str, torch.Tensor]) -> None:
    """Write images ``first..`` of each layer's grid (``[n, H, W, D]``)."""
    group = open_grids(root)
    for key, g in grids.items():
        arr = group[key]
        arr[first : first + g.shape[0]] = g.float().numpy().astype(arr.dtype)


def finish_grids(root: Path, layers: list[str], n_images: int) -> None:
    """Cut each grid to the ``n_images`` exported."""
    group = open_grids(root)
    for key in layers:
        arr = group[key]
        arr.resize((n_images, *arr.shape[1:]))


def saev_name(number: int) -> str:
    return f"acts{number:06d}.bin"


def write_saev(root: Path, number: int, acts: np.ndarray, shard_size: int) -> int:
    """One saev shard: float32 ``[shard_size, layers, 1 + patches, D]`` ([CLS] first), the rows
    past the images written zero (saev maps every shard at full size); the bytes written."""
    rows = np.zeros((shard_size, *acts.shape[1:]), dtype=np.float32)
    rows[: acts.shape[0]] = acts
    data = rows.tobytes()
    write_bytes_atomic(root / SAEV / saev_name(number), data)
    return len(data)


def write_saev_metadata(
    root: Path, spec: str, images: str, layers: list[int], shape: tuple[int, int, bool], n: int,
    shard_size: int,
) -> None:  # fmt: skip
    """saev's ``metadata.json``: ``shape`` is (patches per image, width, whether token 0 is a
    real [CLS]), ``n`` the images exported."""
    n_patches, d, cls_token = shape
    write_json_atomic(
        root / SAEV / "metadata.json",
        {
            "vit_family": "vitreg",
            "vit_ckpt": spec,
            "layers": layers,
            "n_patches_per_img": n_patches,
            "cls_token": cls_token,
            "d_vit": d,
            "seed": 0,
            "n_imgs": n,
            "n_patches_per_shard": shard_size * len(layers) * (n_patches + 1),
            "data": images,
        },
    )
