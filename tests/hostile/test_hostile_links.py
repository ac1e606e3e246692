"""Links out of a folder a user names (issue 24): an image linked outside an image folder is a
counted skip, never read; a feature-cache shard or manifest entry and a run's metrics.json that
lead outside are errors naming the link and where it leads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from _support.cache_worker import ToyDataset, small_vit
from _support.cli_helpers import flat
from vitreg.cli.app import app
from vitreg.data.folder import FolderLog, iter_folder, walk_folder
from vitreg.errors import InputError
from vitreg.probe import extract
from vitreg.probe.features import CachedFeatures
from vitreg.probe.shards import MANIFEST, shard_name
from vitreg.report.compare import compare_runs
from vitreg.report.documents import read_metrics

runner = CliRunner()


def test_images_linked_outside_the_folder_are_counted_skips(tmp_path: Path) -> None:
    folder, elsewhere = tmp_path / "images", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    Image.new("RGB", (16, 16)).save(folder / "own.png")
    Image.new("RGB", (16, 16)).save(elsewhere / "other.png")
    (folder / "in.png").symlink_to(folder / "own.png")  # inside: used
    (folder / "other.png").symlink_to(elsewhere / "other.png")
    (folder / "passwd.png").symlink_to("/etc/passwd")
    files, skipped = walk_folder(folder)
    assert [p.name for p in files] == ["in.png", "own.png"]
    assert {s.path.name: s.reason for s in skipped} == {
        "other.png": "link_outside",
        "passwd.png": "link_outside",
    }
    log = FolderLog()
    used = sum(b.shape[0] for b in iter_folder(folder, lambda im: torch.zeros(3, 4, 4), log=log))
    assert used == 2 and len(log.skipped) == 2
    assert all("outside the folder; not read" in why for why in log.skipped.values())


@pytest.mark.usefixtures("one_thread")
def test_cache_shards_and_entries_leading_outside_are_errors(tmp_path: Path) -> None:
    model, data = small_vit(), ToyDataset(n=4)
    args = {"root": tmp_path / "cache", "views": ("cls",), "dtype": torch.float32, "shard_size": 2}
    cache = extract(model, data, **args)
    shard, moved = cache.folder / shard_name(1), tmp_path / "moved.safetensors"
    shard.rename(moved)
    shard.symlink_to(moved)
    with pytest.raises(InputError, match=r"feature cache shard .* leads .*moved.safetensors"):
        extract(model, data, **args)
    shard.unlink()
    manifest = json.loads((cache.folder / MANIFEST).read_text())
    manifest["shards"][1]["file"] = "../../moved.safetensors"
    (cache.folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="feature cache shard .* outside the folder"):
        CachedFeatures(cache.folder).get("cls", -1)


def test_a_metrics_json_linked_outside_its_run_is_never_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").symlink_to("/etc/passwd")
    with pytest.raises(InputError, match="metrics.json .* leads .* to '/etc/passwd'"):
        read_metrics(run)
    with pytest.raises(InputError, match="none of the 1 paths .* outside the folder"):
        compare_runs([run])
    result = runner.invoke(app, ["validate", str(run)])
    assert result.exit_code == 2 and "outside the folder" in flat(result.output)
    assert "root:" not in result.output  # nothing of the file echoed


@pytest.mark.filterwarnings("ignore:only 1 usable sample")
def test_dataset_listings_and_targets_that_leave_the_folder_are_never_read(tmp_path) -> None:
    from vitreg.train.data import open_data

    root = tmp_path / "voc"
    (root / "JPEGImages").mkdir(parents=True)
    (root / "SegmentationClass").mkdir()
    Image.new("RGB", (40, 32)).save(root / "JPEGImages" / "a.jpg")
    Image.new("RGB", (40, 32)).save(root / "JPEGImages" / "b.jpg")
    Image.new("L", (40, 32)).save(tmp_path / "mask.png")
    (root / "SegmentationClass" / "a.png").symlink_to(tmp_path / "mask.png")  # leads out
    Image.new("L", (40, 32)).save(root / "SegmentationClass" / "b.png")
    sets = root / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    (sets / "train.txt").write_text("a\nb\n")
    data = open_data(f"voc:{root}")
    assert [data[i].key for i in range(len(data)) if _readable(data, i)] == ["b"]
    assert data.log.to_dict() == {"missing_mask": 1}  # the link out counts as no mask
    (sets / "train.txt").write_text("a\n../../mask\n")
    with pytest.raises(InputError, match=r"lists '../../mask', not an image id"):
        open_data(f"voc:{root}")


def _readable(data, i: int) -> bool:
    from vitreg.data.datasets import SkipSample

    try:
        data[i]
    except SkipSample:
        return False
    return True
