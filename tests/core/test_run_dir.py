"""Run directories vitreg owns (issue 24): a manifest of every file a run writes, ``--overwrite``
removing only those, a folder with anything else refused, one run at a time under a lock (a
dead process's lock taken over), and the partial files of a killed run refused until removed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from vitreg.core.io import write_bytes_atomic, write_json_atomic, write_text_atomic
from vitreg.core.run_dir import LOCK, MANIFEST, claim, reopen, session
from vitreg.errors import InputError
from vitreg.train.log import append_record

SPEC = "planted:dinov2_s14"


def manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text())


def run_into(out: Path, verb: str = "diagnose", overwrite: bool = False) -> Path:
    """A complete run: metrics.json, a figure in a subfolder and a log line."""
    with session():
        claim(out, verb, SPEC, overwrite)
        write_json_atomic(out / "metrics.json", {"verb": verb})
        write_bytes_atomic(out / "figures" / "norm_maps.png", b"png")
        append_record(out / "log.jsonl", {"step": 1})
    return out


def test_the_manifest_lists_every_file_written_and_the_run_ends_complete(tmp_path) -> None:
    out = run_into(tmp_path / "run")
    doc = manifest(out)
    assert doc["files"] == ["figures/norm_maps.png", "log.jsonl", "metrics.json"]
    assert (doc["verb"], doc["model"], doc["state"]) == ("diagnose", SPEC, "complete")
    assert not (out / LOCK).exists()  # released


def test_user_files_in_out_are_refused_and_never_touched(tmp_path) -> None:
    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    (out / "report.md").write_text("my notes")
    (out / "figures" / "norm_maps.png").write_bytes(b"my figure")
    for overwrite in (False, True):
        with pytest.raises(InputError, match=r"files vitreg did not write \('figures/norm_maps"):
            claim(out, "diagnose", SPEC, overwrite)
    assert (out / "report.md").read_text() == "my notes"
    assert (out / "figures" / "norm_maps.png").read_bytes() == b"my figure"
    assert sorted(p.name for p in out.iterdir()) == ["figures", "report.md"]  # no lock left


def test_overwrite_removes_only_the_manifest_files(tmp_path) -> None:
    out = run_into(tmp_path / "run")
    (out / "figures" / "mine.png").write_bytes(b"user")  # added later by the user
    with pytest.raises(InputError, match="did not write"):
        claim(out, "diagnose", SPEC, overwrite=True)
    assert (out / "metrics.json").is_file()  # refused as a whole: nothing removed
    (out / "figures" / "mine.png").unlink()
    with pytest.raises(InputError, match="this same command on this model"):
        claim(out, "diagnose", SPEC)
    with session():
        claim(out, "diagnose", SPEC, overwrite=True)
        assert sorted(p.name for p in out.iterdir()) == [LOCK, MANIFEST]


def test_a_forged_comparison_or_manifest_never_removes_a_sibling(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "metrics.json").write_text("{}")
    out = run_into(tmp_path / "run")
    forged = {"verb": "diagnose", "runs": [{"run_dir": "../victim"}, {"run_dir": "victim"}]}
    write_json_atomic(out / "metrics.json", forged)  # a manifest file, edited
    with pytest.raises(InputError, match=r"cannot prove it wrote \('metrics.json'\)"):
        claim(out, "diagnose", SPEC, overwrite=True)  # an edited file is no longer the run's
    assert (out / "metrics.json").is_file() and (out / "log.jsonl").is_file()  # nothing removed
    (out / "metrics.json").unlink()
    with session():
        claim(out, "diagnose", SPEC, overwrite=True)  # removes the manifest's files only
    assert (victim / "metrics.json").is_file()
    run_into(out)
    doc = manifest(out)
    for name in ("../victim/metrics.json", "/etc/hostname"):
        (out / MANIFEST).write_text(json.dumps({**doc, "files": [*doc["files"], name]}))
        with pytest.raises(InputError, match="not a file inside the folder"):
            claim(out, "diagnose", SPEC, overwrite=True)
    assert (victim / "metrics.json").is_file() and (out / "metrics.json").is_file()


def test_a_link_in_out_is_never_followed_or_removed(tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "norm_maps.png").write_bytes(b"keep")
    out = run_into(tmp_path / "run")
    (out / "figures" / "norm_maps.png").unlink()
    (out / "figures").rmdir()
    (out / "figures").symlink_to(outside)  # the manifest's figure now leads outside
    with pytest.raises(InputError, match=r"did not write \('figures'\)"):
        claim(out, "diagnose", SPEC, overwrite=True)
    assert (outside / "norm_maps.png").read_bytes() == b"keep"


def test_a_second_run_is_refused_naming_the_first(tmp_path) -> None:
    out = tmp_path / "run"
    with session():
        claim(out, "train", "vit_tiny_patch16_224")
        append_record(out / "log.jsonl", {"step": 1})
        held = json.loads((out / LOCK).read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        with pytest.raises(InputError, match=f"in use by another vitreg run \\(pid {os.getpid()}"):
            claim(out, "train", "vit_tiny_patch16_224")
    assert (out / "log.jsonl").read_text().count("\n") == 1


def test_a_dead_process_lock_is_taken_over_and_another_host_is_named(tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    stale = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "earlier"}
    (out / LOCK).write_text(json.dumps(stale))
    with session():
        claim(out, "diagnose", SPEC)  # the dead pid's lock is taken over
    (out / LOCK).write_text(json.dumps({**stale, "host": "elsewhere"}))
    with pytest.raises(InputError, match="locked by a vitreg run on another machine.*elsewhere"):
        claim(out, "diagnose", SPEC)


KILLED = """
import os, signal, sys
from pathlib import Path
from vitreg.core.io import write_bytes_atomic
from vitreg.core.run_dir import claim
out = Path(sys.argv[1])
claim(out, "diagnose", "planted:dinov2_s14")
write_bytes_atomic(out / "figures" / "norm_maps.png", b"partial")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_run_leaves_marked_partials_that_are_refused_then_removed(tmp_path) -> None:
    out = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILLED, str(out)], env=os.environ)
    assert killed.returncode == -signal.SIGKILL
    doc = manifest(out)
    assert doc["state"] == "running" and doc["files"] == ["figures/norm_maps.png"]
    with pytest.raises(InputError, match="partial files of a `vitreg diagnose` run .* did not"):
        claim(out, "diagnose", SPEC)  # its stale lock taken over, its partials refused
    with session():
        claim(out, "diagnose", SPEC, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == []


def test_a_resumable_verb_continues_its_own_unfinished_run(tmp_path) -> None:
    out = tmp_path / "run"
    with pytest.raises(RuntimeError), session():
        claim(out, "train", "vit_tiny_patch16_224", resume=True)
        append_record(out / "log.jsonl", {"step": 1})
        raise RuntimeError("interrupted")
    assert manifest(out)["state"] == "incomplete"
    with session():
        claim(out, "train", "vit_tiny_patch16_224", resume=True)
        write_text_atomic(out / "train.json", "{}")
    doc = manifest(out)
    assert doc["state"] == "complete" and doc["files"] == ["log.jsonl", "train.json"]


def test_a_reopened_run_keeps_its_state_and_records_what_is_added(tmp_path) -> None:
    out = run_into(tmp_path / "run")
    with session():
        reopen(out)
        write_text_atomic(out / "report.md", "# again")
    doc = manifest(out)
    assert doc["state"] == "complete" and "report.md" in doc["files"]
    bare = tmp_path / "library"  # written by the library's writers: locked, never owned
    bare.mkdir()
    with session():
        reopen(bare)
        write_text_atomic(bare / "report.md", "# again")
    assert sorted(p.name for p in bare.iterdir()) == ["report.md"]
