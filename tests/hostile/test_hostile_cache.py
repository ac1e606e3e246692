"""A feature-cache shard damaged on disk -- in place, at the same size, or in its header -- is
detected by its checksum, extracted again (counted in the manifest and the probe report) and
never read: the features equal those of an undamaged cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _support.cache_worker import ToyDataset, small_vit
from vitreg.probe import extract
from vitreg.probe.shards import shard_name

pytestmark = pytest.mark.usefixtures("one_thread")
VIEWS = ("cls", "patch_mean")


def flip(path: Path, offset: int) -> None:
    """Invert one byte of ``path`` in place (its size unchanged)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupted_shard_is_re_extracted_and_counted(tmp_path) -> None:
    model, data = small_vit(), ToyDataset(n=6)
    args = {"root": tmp_path, "views": VIEWS, "dtype": torch.float32, "shard_size": 3}
    clean = extract(model, data, **args)
    want = clean.get("cls", -1).clone()
    assert clean.manifest["replaced"] == {} and all(s["sha256"] for s in clean.manifest["shards"])
    shard = clean.folder / shard_name(1)
    size = shard.stat().st_size

    flip(shard, size - 5)  # a tensor byte: the file still opens, the values changed
    assert shard.stat().st_size == size
    again = extract(model, data, **args)
    assert again.forward_passes == 1  # shard 1 only (3 samples, batch 32)
    assert again.manifest["replaced"] == {"checksum mismatch": 1}
    assert torch.equal(again.get("cls", -1), want)

    reused = extract(model, data, **args)
    assert reused.forward_passes == 0 and reused.manifest["replaced"] == {}

    flip(shard, 12)  # a header byte: the file no longer opens as safetensors
    header = extract(model, data, **args)
    assert header.manifest["replaced"] == {"unreadable": 1}
    assert torch.equal(header.get("cls", -1), want)


def test_probe_report_names_the_re_extracted_shards(tmp_path) -> None:
    from vitreg.probe.linear import FitSettings
    from vitreg.probe.run import run
    from vitreg.report.renderers.probe import write_probe_run

    model, cache = small_vit(), tmp_path / "cache"
    data = "synthetic-cls:n=8,size=28"
    cfg = FitSettings(seeds=(0,), epochs=1)
    first = run(model, "classification", data, cache_dir=cache, config=cfg)
    flip(Path(first.results.caches["base/test"].folder) / shard_name(0), -3)
    second = run(model, "classification", data, cache_dir=cache, config=cfg)
    assert second.results.caches["base/test"].replaced == {"checksum mismatch": 1}
    assert second.results.caches["base/train"].replaced == {}
    out = tmp_path / "run"
    write_probe_run(out, second.results, second.model, {}, "vitreg probe")
    text = (out / "report.md").read_text()
    assert "extracted again: base/test: 1 (checksum mismatch)" in text
