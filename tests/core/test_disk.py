"""Every writer's failure named: a full, read-only or forbidden disk is one
:class:`~vitreg.errors.WriteError` paragraph naming the path and the free space (exit 2 on the
CLI), never a traceback or a bug report; the files finished before it are kept, no temporary
file is left behind, and a run's manifest says it did not finish."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from _support.cache_worker import ToyDataset, small_vit
from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app
from vitreg.core import disk
from vitreg.core.disk import free_space, replace_atomic
from vitreg.core.io import write_bytes_atomic, write_text_atomic
from vitreg.core.run_dir import LOCK, MANIFEST, claim, session
from vitreg.errors import WriteError
from vitreg.probe import extract
from vitreg.report.writer import write_run
from vitreg.train.log import append_record

FAILURES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "quota",
    errno.EROFS: "read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def fail_after(monkeypatch, n: int, code: int = errno.ENOSPC) -> None:
    """The low write succeeds ``n`` times, then fails with ``code`` every time."""
    calls = {"n": 0}
    real = disk._write_all

    def write(f, data):
        calls["n"] += 1
        if calls["n"] > n:
            raise OSError(code, os.strerror(code))
        real(f, data)

    monkeypatch.setattr(disk, "_write_all", write)


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*.tmp"))


@pytest.mark.parametrize("code", sorted(FAILURES))
def test_each_failure_is_named_with_the_path_and_the_free_space(tmp_path, monkeypatch, code):
    write_text_atomic(tmp_path / "done.txt", "finished")
    write_text_atomic(tmp_path / "report.md", "old")
    fail_after(monkeypatch, 0, code)
    with pytest.raises(WriteError) as caught:
        write_text_atomic(tmp_path / "report.md", "new")
    text = str(caught.value)
    assert FAILURES[code] in text and repr(str(tmp_path / "report.md")) in text
    assert " free on its disk" in text and "\n" not in text and caught.value.errno == code
    assert (tmp_path / "done.txt").read_text() == "finished"  # finished files kept
    assert (tmp_path / "report.md").read_text() == "old"  # never half replaced
    assert temp_files(tmp_path) == []


def test_a_folder_that_cannot_be_made_is_named(tmp_path, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(WriteError, match="permission denied.*pass a folder you may write to"):
        write_bytes_atomic(tmp_path / "new" / "a.bin", b"x")
    with pytest.raises(WriteError, match="permission denied"):
        claim(tmp_path / "run", "diagnose", None)


def test_free_space_is_told_in_units() -> None:
    assert free_space("/").endswith(" free") and free_space("/no/such/folder/x").endswith(" free")


def test_a_run_that_fills_the_disk_keeps_its_finished_files_and_says_so(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with pytest.raises(WriteError, match="figures/norm_maps.png': the disk is full"), session():
        claim(out, "diagnose", "planted:dinov2_s14")
        write_text_atomic(out / "config.yaml", "verb: diagnose\n")
        fail_after(monkeypatch, 1)  # the manifest lists the figure, then the disk is full
        write_bytes_atomic(out / "figures" / "norm_maps.png", b"png")
    monkeypatch.undo()
    assert (out / "config.yaml").read_text() == "verb: diagnose\n"
    assert temp_files(out) == [] and not (out / "figures" / "norm_maps.png").exists()
    doc = json.loads((out / MANIFEST).read_text())
    assert doc["state"] == "running"  # its last save failed too: still marked unfinished
    assert not (out / LOCK).exists()  # the lock is released all the same
    with pytest.raises(Exception, match="partial files"):
        claim(out, "diagnose", "planted:dinov2_s14")


def test_the_train_log_and_the_report_writer_name_the_disk(tmp_path, monkeypatch) -> None:
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(WriteError, match="log.jsonl': the disk is full"):
        append_record(tmp_path / "log.jsonl", {"step": 1})
    monkeypatch.undo()

    class Drawn:  # a figure whose PNG meets a full disk
        name, caption = "norm_maps", "norms"

        def save(self, folder, formats):
            return [write_bytes_atomic(folder / "norm_maps.png", b"png")]

    fail_after(monkeypatch, 1)  # config.yaml is written, the figure is not
    with pytest.raises(WriteError, match="norm_maps.png': the disk is full"):
        write_run(tmp_path / "run", {"config": {"verb": "diagnose"}}, figures=lambda: [Drawn()])
    assert (tmp_path / "run" / "config.yaml").is_file()


def test_the_feature_cache_names_a_full_disk(tmp_path, monkeypatch, one_thread) -> None:
    fail_after(monkeypatch, 0)
    with pytest.raises(WriteError, match=r"shard-00000\.safetensors': the disk is full"):
        extract(small_vit(), ToyDataset(n=3), root=tmp_path, views=("cls",), dtype=torch.float32)
    assert temp_files(tmp_path) == []


def test_schema_out_names_the_disk_and_refuses_a_folder_or_an_existing_file(
    tmp_path, monkeypatch
) -> None:
    runner = CliRunner()
    target = tmp_path / "schema.json"
    result = runner.invoke(app, ["schema", "--out", str(tmp_path)])
    assert_clean_failure(result, "is a folder", "pass a file name")
    target.write_text("mine")
    result = runner.invoke(app, ["schema", "--out", str(target)])
    assert_clean_failure(result, "already exists", "--overwrite")
    assert target.read_text() == "mine"
    fail_after(monkeypatch, 0, errno.EROFS)
    result = runner.invoke(app, ["schema", "--out", str(target), "--overwrite"])
    assert_clean_failure(result, "schema.json", "read-only", "free on its disk")
    assert target.read_text() == "mine" and temp_files(tmp_path) == []
    monkeypatch.undo()
    result = runner.invoke(app, ["schema", "--out", str(target), "--overwrite"])
    assert result.exit_code == 0 and isinstance(json.loads(target.read_text()), dict)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_real_read_only_folder_is_named(tmp_path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(WriteError, match="permission denied"):
            write_text_atomic(folder / "a.txt", "x")
        with pytest.raises(WriteError, match="permission denied"):
            claim(folder / "run", "diagnose", None)
    finally:
        folder.chmod(0o755)


def test_replace_atomic_calls_before_with_the_data_on_disk(tmp_path) -> None:
    seen = []
    replace_atomic(tmp_path / "a", b"abc", before=lambda: seen.append(temp_files(tmp_path)))
    assert len(seen) == 1 and len(seen[0]) == 1 and (tmp_path / "a").read_bytes() == b"abc"
