"""``vitreg export`` writes safetensors shards with an index, parquet tables and zarr grids that
their own libraries read, from a folder and from webdataset shards, and reads them back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vitreg
from _support.export_helpers import make_images, same_tensors, shard_tensors
from vitreg.configs import ExportConfig
from vitreg.export import open as open_export
from vitreg.export.sites import KIND_CODES

BASE = {"spec": "planted:dinov2_s14", "img_size": 56, "batch_size": 4, "shard_size": 4}


def run(out: Path, **kw: object) -> object:
    return vitreg.run(ExportConfig(**{**BASE, **kw, "out": out}))


def test_folder_and_shards_give_every_format(tmp_path: Path, cli_models) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    zarr = pytest.importorskip("zarr")
    folder, pattern = make_images(tmp_path, n=6)
    formats = "safetensors,parquet,zarr"
    a = run(tmp_path / "a", images=folder, layers="3,11", formats=formats, tokens="patches,cls")
    b = run(tmp_path / "b", images=pattern, layers="3,11", formats=formats, tokens="patches,cls")
    index = a.index
    assert index.complete and index.n_images == 6 and len(index.shards) == 2  # 4 + 2 images
    assert [s.names[0] for s in index.shards] == [str(folder / "000.png"), str(folder / "004.png")]
    assert b.index.shards[0].names[0] == "shard-0.tar/000.png"
    assert same_tensors(shard_tensors(a.run_dir), shard_tensors(b.run_dir))  # the same images
    n_tokens = 1 + 16  # [CLS] and a 4x4 grid
    # safetensors, through vitreg.export.open
    tokens = open_export(a.run_dir, layer=11)
    assert len(tokens) == 6 * n_tokens
    first, patch = tokens[0], tokens[1]
    assert first["activation"].shape == (384,) and KIND_CODES[first["kind"]] == "cls"
    assert (patch["row"], patch["col"], KIND_CODES[patch["kind"]]) == (0, 0, "patch")
    assert tokens[n_tokens]["image"] == 1
    streamed = torch.stack(list(tokens.shards()))
    assert torch.equal(streamed, tokens.activations())
    assert torch.equal(streamed[5], tokens[5]["activation"])
    # parquet: one table of every token, one of every image
    table = pq.read_table(a.run_dir / "tokens").to_pydict()
    assert len(table["image"]) == 6 * n_tokens
    assert set(table["kind"]) == {"cls", "patch"}
    assert (max(table["row"]), max(table["col"]), min(table["row"])) == (3, 3, -1)
    norms = torch.tensor(table["norm_11"][:n_tokens])
    assert torch.allclose(norms, streamed[:n_tokens].float().norm(dim=-1))
    images = pq.read_table(a.run_dir / "images").to_pydict()
    assert images["file"] == [s for shard in index.shards for s in shard.names]
    assert torch.allclose(torch.tensor(images["cls_11"][0]), streamed[0])
    # zarr: patch grids [images, H, W, D] per layer
    grid = zarr.open_group(str(a.run_dir / "patches.zarr"), mode="r")["11"]
    assert grid.shape == (6, 4, 4, 384)
    assert torch.allclose(torch.from_numpy(grid[1, 0, 0]), streamed[n_tokens + 1])


def test_dtype_site_and_fix_are_written_as_asked(tmp_path: Path, cli_models) -> None:
    plain = run(tmp_path / "plain", limit=3, site="mlp_post", layers="2", dtype="float16")
    acts = shard_tensors(plain.run_dir)["shard-00000.safetensors"]["2.activations"]
    assert acts.dtype == torch.float16 and acts.shape[-1] == 1536  # the MLP's hidden units
    assert plain.index.settings.sites == ["blocks.2.mlp.hook_post"]
    from vitreg.fix.neuron_set import NeuronSet

    model = cli_models["planted:dinov2_s14"]
    truth = NeuronSet.from_pairs(model.module.vitreg_planted.units, model).save(tmp_path / "truth")
    fixed = run(tmp_path / "fixed", limit=3, fix="ttr", neurons=str(truth), tokens="extra,cls")
    extra = open_export(fixed.run_dir)
    assert {KIND_CODES[extra[i]["kind"]] for i in range(len(extra))} == {"cls", "extra"}
    assert len(extra) == 3 * 2  # one [CLS] and one inserted register per image


def test_bad_choices_are_named_before_the_model_runs(tmp_path: Path, cli_models) -> None:
    from vitreg.errors import InputError

    with pytest.raises(ValueError, match="exportable site"):
        ExportConfig(site="resid_late")
    with pytest.raises(ValueError, match="outliers and/or sinks"):
        ExportConfig(exclude="norms")
    with pytest.raises(ValueError, match="choose from cls, registers, extra, patches"):
        ExportConfig(tokens="pixels")
    with pytest.MonkeyPatch.context() as mp:  # a layer beyond the model: named before it loads
        mp.setattr("vitreg.verbs.loading.load_spec", lambda *a, **k: pytest.fail("loaded"))
        with pytest.raises(InputError, match="beyond the model: it has 12 blocks"):
            run(tmp_path / "far", layers="12")
    with pytest.raises(InputError, match="ln_final has none"):
        run(tmp_path / "final", site="ln_final", exclude="sinks")
