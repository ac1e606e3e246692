"""The ``saev`` format is read by saev's own activation reader (``saev.activations.Dataset``):
every patch and [CLS] row it returns is the activation vitreg exported for that token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vitreg
from vitreg.configs import ExportConfig
from vitreg.errors import InputError
from vitreg.export import open as open_export

ARGS = {"spec": "planted:dinov2_s14", "img_size": 56, "batch_size": 3, "shard_size": 4}


def test_saev_reads_the_exported_shards(tmp_path: Path, cli_models) -> None:
    activations = pytest.importorskip("saev.activations", reason="saev not installed")
    config = pytest.importorskip("saev.config")
    cfg = ExportConfig(**ARGS, limit=7, layers="4,8", formats="safetensors,saev",
                       tokens="cls,patches", out=tmp_path / "x")  # fmt: skip
    run = vitreg.run(cfg)
    root = str(run.run_dir / "saev")
    for layer in (4, 8):
        ours = open_export(run.run_dir, layer=layer)
        rows = [ours[i] for i in range(len(ours))]
        patches = torch.stack([r["activation"] for r in rows if r["kind"] == 3]).float()
        cls = torch.stack([r["activation"] for r in rows if r["kind"] == 0]).float()
        load = config.DataLoad(shard_root=root, layer=layer, scale_mean=False, scale_norm=False)
        theirs = activations.Dataset(load)
        assert len(theirs) == patches.shape[0] == 7 * 16  # the padded last shard is not read
        got = torch.stack([theirs[i]["act"] for i in range(len(theirs))])
        torch.testing.assert_close(got, patches, rtol=0, atol=0)
        assert theirs[17]["image_i"] == 1 and theirs[17]["patch_i"] == 1
        by_cls = config.DataLoad(shard_root=root, layer=layer, patches="cls",
                                 scale_mean=False, scale_norm=False)  # fmt: skip
        heads = activations.Dataset(by_cls)
        got_cls = torch.stack([heads[i]["act"] for i in range(len(heads))])
        torch.testing.assert_close(got_cls, cls, rtol=0, atol=0)


def test_saev_needs_a_block_layer(tmp_path: Path) -> None:
    cfg = ExportConfig(**ARGS, limit=2, site="ln_final", formats="saev", out=tmp_path / "x")
    with pytest.raises(InputError, match="saev keys its shards by block"):
        vitreg.run(cfg)
