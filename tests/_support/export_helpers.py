"""What the export tests share: a few synthetic images as a folder and as webdataset shards,
and the tensors of every shard of an export."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import torch
from PIL import Image

from vitreg.testing.images import synthetic_pil


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def make_images(tmp_path: Path, n: int = 6, size: int = 56) -> tuple[Path, str]:
    """``n`` synthetic images as a folder and as two webdataset shards, in the same order."""
    items = [(f"{i:03d}", png(p)) for i, p in enumerate(synthetic_pil(n, size, seed=3))]
    folder = tmp_path / "images"
    folder.mkdir()
    for key, data in items:
        (folder / f"{key}.png").write_bytes(data)
    half = (n + 1) // 2
    for s, part in enumerate((items[:half], items[half:])):
        with tarfile.open(tmp_path / f"shard-{s}.tar", "w") as tar:
            for key, data in part:
                info = tarfile.TarInfo(f"{key}.png")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return folder, f"wds:{tmp_path}/shard-{{0..1}}.tar"


def shard_tensors(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Every shard's tensors, by file name."""
    from safetensors.torch import load_file

    return {p.name: load_file(str(p)) for p in sorted(folder.glob("shard-*.safetensors"))}


def same_tensors(
    a: dict[str, dict[str, torch.Tensor]], b: dict[str, dict[str, torch.Tensor]]
) -> bool:
    return a.keys() == b.keys() and all(
        a[f].keys() == b[f].keys() and all(torch.equal(a[f][k], b[f][k]) for k in a[f]) for f in a
    )
