"""``--images wds:PATTERN``: webdataset shards give the metrics of the same images as a folder,
with the same skip/convert accounting, under one process and under torchrun with 2 ranks."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from typer.testing import CliRunner

from conftest import TESTS
from vitreg.cli.app import app
from vitreg.data import wds
from vitreg.errors import InputError
from vitreg.results.schema import DataInfo
from vitreg.testing.images import synthetic_pil

runner = CliRunner()
ARGS = ["diagnose", "planted:dinov2_s14", "--img-size", "56", "--batch-size", "3"]
BROKEN = b"\x89PNG\r\n\x1a\n not really a png"


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make_data(tmp_path: Path) -> tuple[Path, str]:
    """7 images (one grayscale) and one broken file, as a folder and as 3 shards (one more
    sample holds no image at all)."""
    pics = synthetic_pil(7, 56, seed=3)
    pics[4] = pics[4].convert("L")
    items = [(f"{i:03d}", png(p)) for i, p in enumerate(pics)]
    items.insert(2, ("002b", BROKEN))
    folder = tmp_path / "folder"
    folder.mkdir()
    for key, data in items:
        (folder / f"{key}.png").write_bytes(data)
    for s, part in enumerate((items[:3], items[3:6], items[6:])):
        with tarfile.open(tmp_path / f"shard-{s}.tar", "w") as tar:
            for key, data in part:
                add(tar, f"{key}.png", data)
                add(tar, f"{key}.cls", b"0")
            if s == 1:
                add(tar, "zzz.txt", b"no image here")
    return folder, f"wds:{tmp_path}/shard-{{0..2}}.tar"


def equal(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def run(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def model() -> Any:
    import torch

    from vitreg.models.load import load

    torch.manual_seed(0)
    return load("planted:dinov2_s14", img_size=56)


def test_shards_give_the_folder_results_and_accounting(tmp_path: Path, model: Any) -> None:
    from vitreg.data.images import folder_images
    from vitreg.hooks.reducers import Mean, TokenNorms

    folder, pattern = make_data(tmp_path)
    a_src, b_src = folder_images(model, folder, 3), wds.wds_images(model, pattern, 3)
    assert (a_src.total, b_src.total) == (8, 9)  # files / samples, before decoding
    sites = ["blocks.7.hook_resid_post", "blocks.2.mlp.hook_post"]
    a = model.trace(a_src, [TokenNorms(sites[0]), Mean(sites[1])], batch_size=3, limit=None)
    b = model.trace(b_src, [TokenNorms(sites[0]), Mean(sites[1])], batch_size=3, limit=None)
    assert a.n_images == b.n_images == 7
    for ra, rb in zip(a.reducers, b.reducers, strict=True):
        assert equal(ra.result(), rb.result())  # the same images in order: the same numbers
    da, db = a_src.description(), b_src.description()
    assert isinstance(db, DataInfo) and da.n_images == db.n_images == 7  # images used
    assert db.model_extra == {**db.model_extra, "source": "webdataset", "n_shards": 3}
    assert list(db.converted) == ["shard-1.tar/004.png"]
    assert list(da.converted.values()) == list(db.converted.values()) == ["L"]
    skipped = db.skipped
    assert set(skipped) == {"shard-0.tar/002b.png", "shard-1.tar/zzz"}
    assert "'shard-0.tar/002b.png'" in skipped["shard-0.tar/002b.png"]
    assert "no image member" in skipped["shard-1.tar/zzz"]
    assert [v.split(":")[:2] for v in da.skipped.values()] == [
        skipped["shard-0.tar/002b.png"].split(":")[:2]
    ]


def test_limit_counts_images_in_shard_order(tmp_path: Path) -> None:
    _, pattern = make_data(tmp_path)
    seen: list[str] = []
    log = wds.FolderLog()
    batches = list(wds.iter_wds(pattern, lambda im: _tensor(im, seen), 2, limit=4, log=log))
    assert [b.shape[0] for b in batches] == [2, 2]
    assert log.used == [
        f"shard-{s}.tar/{k}.png" for s, k in ((0, "000"), (0, "001"), (1, "002"), (1, "003"))
    ]
    assert wds.count_samples(wds.shard_paths(pattern)) == 9


def _tensor(img: Image.Image, seen: list[str]) -> Any:
    import torch

    seen.append(img.mode)
    return torch.zeros(1)


def test_bad_patterns_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        wds.shard_paths(f"wds:{tmp_path}/none-{{0..1}}.tar")
    with pytest.raises(InputError, match="no pipe"):
        wds.shard_paths("wds:pipe:curl -s http://example.com/x.tar")
    with pytest.raises(InputError, match="no pipe"):
        wds.shard_paths("wds:https://example.com/x.tar")
    (tmp_path / "bad.tar").write_bytes(b"not a tar")
    with pytest.raises(InputError, match="not a readable tar"):
        wds.count_samples([tmp_path / "bad.tar"])
    result = runner.invoke(app, [*ARGS, "--images", f"wds:{tmp_path}/x.tar"])
    assert result.exit_code != 0 and "not found" in result.output


@pytest.mark.slow
def test_cli_shards_equal_the_folder_and_two_torchrun_ranks(tmp_path: Path) -> None:
    sys.path.insert(0, str(TESTS / "distributed"))
    from test_distributed_verbs import VITREG, same, torchrun
    from test_distributed_verbs import metrics as stable

    folder, pattern = make_data(tmp_path)
    run([*ARGS, "--images", str(folder), "--out", str(tmp_path / "folder_run")])
    run([*ARGS, "--images", pattern, "--out", str(tmp_path / "one")])
    torchrun([str(VITREG), *ARGS, "--images", pattern, "--out", str(tmp_path / "two")], True)
    a, b = stable(tmp_path / "one"), stable(tmp_path / "two")
    diffs = same(a, b)
    assert diffs == [], diffs[:10]
    assert a["data"]["n_images"] == 7 and a["data"]["source"] == "webdataset"
    assert same(stable(tmp_path / "folder_run")["results"], a["results"]) == []


def test_the_check_pass_replays_the_one_process_listing(tmp_path: Path, model: Any) -> None:
    import torch

    _, pattern = make_data(tmp_path)
    paths = wds.shard_paths(pattern)
    checks = {s: wds.check_shard(p) for s, p in enumerate(paths)}
    assert [c.kept for c in checks.values()] == [[0, 1], [0, 1, 2], [0, 1]]
    for limit in (None, 4, 2):
        log = wds.FolderLog()
        list(wds.iter_wds(pattern, lambda im: torch.zeros(1), 2, limit=limit, log=log))
        plan = wds.plan_of(checks, limit)
        assert plan.log == log and plan.total == len(log.used)
    plan = wds.plan_of(checks, 4)
    assert (plan.first, plan.take) == ({0: 0, 1: 2, 2: 4}, {0: 2, 1: 2, 2: 0})
    # one rank of one: every shard, batches that never cross a shard, at their global indices
    source = wds.wds_images(model, pattern, batch_size=2)
    parts = list(source.rank_parts(0, 1))
    assert [(i, b.shape[0]) for i, b in parts] == [(0, 2), (2, 2), (4, 1), (5, 2)]
    whole = torch.cat(list(wds.iter_wds(pattern, model.transform, 3)))
    assert torch.equal(torch.cat([b for _, b in parts]), whole)
    assert source.description().n_images == 7 and source.display_images().shape[0] == 7
    assert source.split_note(1) is None and source.split_note(3) is None
    assert "3 shard(s) for 4 torchrun ranks" in source.split_note(4)
    assert source.rank_parts(0, 4) is None  # fewer shards than ranks: the per-batch split


def test_a_pattern_is_counted_before_it_is_expanded(tmp_path: Path) -> None:
    from braceexpand import braceexpand

    for pattern in ("{a,b{1..3},{x..z}}", "{0..10..2}", "{-3..3}", "{00..10}", "{a..e..2}",
                    "{1..a}", "a{}b", "{x,}", "{{1,2}}", "{1..3}{a,b}", "{9..0..3}", "plain"):  # fmt: skip
        assert wds.expansion_size(pattern) == len(list(braceexpand(pattern))), pattern
    assert wds.expansion_size("{0..9}" * 8) == 10**8
    for huge in ("{0..99999999}", "{0..9}" * 8):
        with pytest.raises(InputError, match="100,000,000 shard names"):
            wds.shard_paths(f"wds:{tmp_path}/{huge}.tar")
    with pytest.raises(InputError, match="balance its braces"):
        wds.shard_paths(f"wds:{tmp_path}/\\{{1,2}}.tar")
    with pytest.raises(InputError, match="brace groups"):
        wds.shard_paths("wds:" + "{a,b}" * 2000)


def test_remote_shards_are_named_even_with_the_slashes_collapsed() -> None:
    for pattern in ("http://h/a.tar", "http:/h/a.tar", "s3://b/a.tar", "pipe:cat a.tar"):
        with pytest.raises(InputError, match="remote shards are not read"):
            wds.shard_paths(f"wds:{pattern}")


def test_links_devices_and_fifos_in_a_shard_are_counted_as_skipped(tmp_path: Path) -> None:
    import torch

    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w") as tar:
        add(tar, "000.png", png(synthetic_pil(1, 32, seed=1)[0]))
        for name, kind in (("001.png", tarfile.SYMTYPE), ("002.png", tarfile.LNKTYPE),
                           ("003.png", tarfile.CHRTYPE), ("004.png", tarfile.FIFOTYPE)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, "000.png" if name < "003" else ""
            tar.addfile(info)
    log = wds.FolderLog()
    batches = list(wds.iter_wds(f"wds:{shard}", lambda im: torch.zeros(1), 4, log=log))
    assert len(batches) == 1 and log.used == ["s.tar/000.png"]
    assert log.skipped == {
        "s.tar/001.png": "a symbolic link in the shard; only regular files are read",
        "s.tar/002.png": "a hard link in the shard; only regular files are read",
        "s.tar/003.png": "a character device in the shard; only regular files are read",
        "s.tar/004.png": "a FIFO in the shard; only regular files are read",
    }
    assert wds.plan_of({0: wds.check_shard(shard)}, None).log == log  # the torchrun check too


def test_a_sample_is_its_key_and_url_as_text_and_each_member_as_bytes(tmp_path: Path) -> None:
    make_data(tmp_path)
    shard = tmp_path / "shard-1.tar"
    samples = list(wds.iter_samples([shard]))
    assert [s["__key__"] for s in samples] == ["002", "003", "004", "zzz"]
    for sample in samples:
        assert {k for k, v in sample.items() if isinstance(v, str)} >= {"__key__", "__url__"}
        assert all(isinstance(v, bytes) for k, v in sample.items() if not k.startswith("__"))
    name, decode, why = wds.sample_entry(samples[0])
    assert (name, why) == ("shard-1.tar/002.png", "") and decode is not None
    assert decode()[0].size == (56, 56)
    name, decode, why = wds.sample_entry(samples[-1])
    assert (name, decode) == ("shard-1.tar/zzz", None) and why.endswith("(has txt)")
