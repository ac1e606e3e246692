"""An export is resumable: a disk that fills mid-export is a clear error that keeps the finished
shards and a valid index, a rerun resumes and ends with the files of an uninterrupted run; a
rerun with other settings, or into a folder vitreg did not write, is refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import vitreg
from _support.export_helpers import same_tensors, shard_tensors
from vitreg.configs import ExportConfig
from vitreg.core import disk
from vitreg.errors import InputError, WriteError
from vitreg.export import open as open_export
from vitreg.export import shard as shard_module

BASE = {"spec": "planted:dinov2_s14", "img_size": 56, "batch_size": 3, "shard_size": 4}
ARGS = {**BASE, "limit": 10, "layers": "4,8", "exclude": "outliers"}


def run(out: Path, **kw: object) -> object:
    return vitreg.run(ExportConfig(**{**ARGS, **kw, "out": out}))


def fill_disk_at(monkeypatch: pytest.MonkeyPatch, shard: str) -> None:
    """The disk is full when ``shard``'s safetensors file is written (once)."""
    armed = {"on": False}
    real_write, real_low = shard_module.write_safetensors, disk._write_all

    def write(path: Path, tensors: object, meta: str) -> int:
        armed["on"] = path.name == shard
        return real_write(path, tensors, meta)

    def low(f: object, data: bytes) -> None:
        if armed["on"]:
            armed["on"] = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_low(f, data)

    monkeypatch.setattr(shard_module, "write_safetensors", write)
    monkeypatch.setattr(disk, "_write_all", low)


def test_a_full_disk_keeps_the_finished_shards_and_a_rerun_resumes(
    tmp_path: Path, cli_models, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = run(tmp_path / "whole")
    assert len(whole.index.shards) == 3 and whole.results.resumed_shards == 0
    with monkeypatch.context() as mp:
        fill_disk_at(mp, "shard-00001.safetensors")
        with pytest.raises(WriteError, match="the disk is full"):
            run(tmp_path / "cut")
    kept = open_export(tmp_path / "cut", partial=True)  # the index is valid, one shard long
    assert [s.file for s in kept.index.shards] == ["shard-00000.safetensors"]
    assert not kept.index.complete and len(kept) == whole.index.shards[0].rows["4"]
    with pytest.raises(InputError, match="not finished"):
        open_export(tmp_path / "cut")
    assert not list((tmp_path / "cut").rglob("*.tmp"))
    resumed = run(tmp_path / "cut")
    assert resumed.results.resumed_shards == 1
    assert resumed.index == whole.index  # names, counts, rules: every field
    kept = whole.index.shards[0].bytes  # the rates count what this run wrote
    assert resumed.results.bytes_written == whole.results.bytes_written - kept
    assert same_tensors(shard_tensors(tmp_path / "cut"), shard_tensors(tmp_path / "whole"))


def test_a_killed_export_resumes_to_the_uninterrupted_files(
    tmp_path: Path, cli_models, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = run(tmp_path / "whole", limit=7)
    real = shard_module.Shard.write
    calls = {"n": 0}

    def killed(self: shard_module.Shard, *args: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, *args)

    with monkeypatch.context() as mp:
        mp.setattr(shard_module.Shard, "write", killed)
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path / "killed", limit=7)
    resumed = run(tmp_path / "killed", limit=7)
    assert resumed.results.resumed_shards == 1 and resumed.index == whole.index
    assert same_tensors(shard_tensors(tmp_path / "killed"), shard_tensors(tmp_path / "whole"))


def test_other_settings_and_foreign_folders_are_refused(tmp_path: Path, cli_models) -> None:
    run(tmp_path / "done", limit=4)
    with pytest.raises(InputError, match=r"other settings \(dtype: 'float32' -> 'float16'\)"):
        run(tmp_path / "done", limit=4, dtype="float16")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="holds files vitreg did not write"):
        run(foreign, limit=4)
