"""The run manifest proves ownership: a file is removed by ``--overwrite`` (or continued by a
resume) only while it holds what vitreg recorded; a forged, edited, old or huge manifest is
refused with a named error and every file left as it was."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure, files_of, refuse_model_loading
from vitreg.cli.app import app
from vitreg.core.io import write_bytes_atomic, write_json_atomic
from vitreg.core.manifest import MAX_FILES, Manifest, Record, document, read_manifest
from vitreg.core.run_dir import LOCK, MANIFEST, claim, session
from vitreg.errors import InputError

SPEC = "planted:dinov2_s14"
THESIS = b"\\documentclass{article}\n\\begin{document}My thesis.\\end{document}\n"


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    """Fail the test if any command starts loading a model."""
    refuse_model_loading(monkeypatch)


def run_into(out: Path, names: tuple[str, ...] = ("metrics.json",)) -> Path:
    with session():
        claim(out, "diagnose", SPEC)
        for name in names:
            write_bytes_atomic(out / name, f"written as {name}".encode())
    return out


def forge(out: Path, files: list[str], records: dict[str, Record] | None = None) -> None:
    """A manifest vitreg did not write: an old-style one, or (``records``) a well-formed one."""
    if records is None:
        doc = {"verb": "diagnose", "model": None, "state": "complete", "files": files}
        (out / MANIFEST).write_text(json.dumps(doc))
    else:
        run = Manifest("diagnose", None, "complete", "", files, records)
        (out / MANIFEST).write_bytes(document(run, 1, "elsewhere"))


def test_the_manifest_records_size_and_hash_of_every_file_and_its_own_hash(tmp_path) -> None:
    out = run_into(tmp_path / "run", ("metrics.json", "figures/a.png"))
    doc = json.loads((out / MANIFEST).read_text())
    assert doc["vitreg_run"] == 2 and doc["files"] == ["figures/a.png", "metrics.json"]
    data = b"written as metrics.json"
    assert doc["records"]["metrics.json"] == {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    body = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert doc["manifest_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    read = read_manifest(out)
    assert read is not None and read.records["figures/a.png"].matches(out / "figures/a.png")


def test_a_forged_manifest_listing_the_users_thesis_never_deletes_it(tmp_path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_bytes(THESIS)
    forge(out, ["thesis.tex"])
    assert (out / MANIFEST).stat().st_size < 300
    before = files_of(out)
    with pytest.raises(InputError, match=r"cannot prove it wrote \('thesis.tex'\)"):
        claim(out, "diagnose", SPEC, overwrite=True)
    result = CliRunner().invoke(app, ["diagnose", SPEC, "--out", str(out), "--overwrite"])
    assert_clean_failure(result, "cannot prove it wrote", "thesis.tex", "never removes")
    assert files_of(out) == before and not (out / LOCK).exists()


@pytest.mark.parametrize("how", ["same size", "size only", "right hash, edited manifest"])
def test_a_forged_record_of_the_same_size_is_no_proof(tmp_path, how: str) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_bytes(THESIS)
    other = Record.of_bytes(b"x" * len(THESIS))  # same size, other content
    assert other.size == len(THESIS) and other.sha256 != Record.of_bytes(THESIS).sha256
    if how == "same size":
        forge(out, ["thesis.tex"], {"thesis.tex": other})
        match = "cannot prove it wrote"
    elif how == "size only":  # a record without a hash is not a record
        doc = json.loads(document(Manifest("diagnose", None, "complete"), 1, "h"))
        doc.update(files=["thesis.tex"], records={"thesis.tex": {"size": len(THESIS)}})
        (out / MANIFEST).write_text(json.dumps(doc))
        match = "not a size and hash"
    else:  # the true hash, but written into the manifest by hand
        forge(out, ["thesis.tex"], {"thesis.tex": other})
        doc = json.loads((out / MANIFEST).read_text())
        doc["records"]["thesis.tex"] = vars(Record.of_bytes(b"y" * len(THESIS)))
        (out / MANIFEST).write_text(json.dumps(doc))
        match = "edited after vitreg wrote it"
    for resume in (False, True):
        with pytest.raises(InputError, match=match):
            claim(out, "diagnose", SPEC, overwrite=not resume, resume=resume)
    assert (out / "thesis.tex").read_bytes() == THESIS


def test_a_file_changed_after_the_run_wrote_it_is_left_and_named(tmp_path) -> None:
    out = run_into(tmp_path / "run", ("metrics.json", "report.md"))
    (out / "report.md").write_text("my edits")  # same name, the user's content now
    with pytest.raises(InputError, match=r"cannot prove it wrote \('report.md'\): they changed"):
        claim(out, "diagnose", SPEC, overwrite=True)
    assert (out / "report.md").read_text() == "my edits" and (out / "metrics.json").is_file()


def test_an_old_manifest_without_hashes_proves_nothing(tmp_path) -> None:
    out = run_into(tmp_path / "run", ("metrics.json", "report.md"))
    doc = json.loads((out / MANIFEST).read_text())
    old = {k: doc[k] for k in ("verb", "model", "state", "started", "pid", "host", "files")}
    (out / MANIFEST).write_text(json.dumps({"vitreg_run": 1, **old}))
    before = files_of(out)
    with pytest.raises(InputError, match=r"cannot prove.*'metrics.json', 'report.md'.*older"):
        claim(out, "diagnose", SPEC, overwrite=True)
    with pytest.raises(InputError, match="this same command"):  # without --overwrite: as before
        claim(out, "diagnose", SPEC)
    assert files_of(out) == before
    for name in ("metrics.json", "report.md"):  # the user removes them: the folder is reusable
        (out / name).unlink()
    with session():
        claim(out, "diagnose", SPEC, overwrite=True)
        write_json_atomic(out / "metrics.json", {})
    assert read_manifest(out).records.keys() == {"metrics.json"}


def test_glob_characters_in_names_are_plain_names(tmp_path) -> None:
    names = ("a**b", "c[d]e", "f?g*")
    out = run_into(tmp_path / "run", names)
    (out / ".a**b.abcd1234.tmp").write_bytes(b"left by a killed write")
    with session():
        claim(out, "diagnose", SPEC, overwrite=True)  # no pattern: no crash, exactly these
        assert sorted(p.name for p in out.iterdir()) == [LOCK, MANIFEST]
    out = tmp_path / "user"
    out.mkdir()
    (out / "aXXb").write_bytes(b"mine")
    forge(out, ["a*b", "*", "**"])
    with pytest.raises(InputError, match=r"did not write \('aXXb'\)"):
        claim(out, "diagnose", SPEC, overwrite=True)
    assert (out / "aXXb").read_bytes() == b"mine"


def test_only_a_temporary_file_named_as_vitreg_names_them_is_removed(tmp_path) -> None:
    out = run_into(tmp_path / "run")
    (out / ".metrics.json.my notes.tmp").write_text("mine")
    with pytest.raises(InputError, match="did not write"):
        claim(out, "diagnose", SPEC, overwrite=True)
    assert (out / ".metrics.json.my notes.tmp").read_text() == "mine"


@pytest.mark.parametrize(
    "name",
    ["../x", "/etc/passwd", "a/../b", "a//b", "a/", "./a", "", "a\x00b", "a\nb", "a\\b",
     "x" * 2000, "y" * 300 + "/z", 7, None, ["a"], LOCK, MANIFEST],
)  # fmt: skip
def test_an_entry_that_is_not_a_plain_relative_name_is_refused(tmp_path, name) -> None:
    out = tmp_path / "run"
    out.mkdir()
    forge(out, [name])
    with pytest.raises(InputError, match="not a file inside the folder"):
        claim(out, "diagnose", SPEC, overwrite=True)


def test_a_huge_manifest_is_refused_at_once(tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    names = ",".join(f'"f{i}"' for i in range(2_000_000))
    (out / MANIFEST).write_text(
        '{"verb": "diagnose", "model": null, "state": "complete", "files": [' + names + "]}"
    )
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["diagnose", SPEC, "--out", str(out), "--overwrite"])
    assert time.perf_counter() - start < 5
    assert_clean_failure(result, "run manifest", MANIFEST, "MiB")
    forge(out, [f"f{i}" for i in range(MAX_FILES + 1)])  # small enough to read: counted
    start = time.perf_counter()
    with pytest.raises(InputError, match=f"lists more than {MAX_FILES:,} files"):
        claim(out, "diagnose", SPEC, overwrite=True)
    assert time.perf_counter() - start < 5 and (out / "keep.txt").read_text() == "mine"


def test_a_resumed_run_continues_only_files_that_match(tmp_path) -> None:
    out = tmp_path / "run"
    with session():
        claim(out, "train", "vit_tiny", resume=True)
        write_bytes_atomic(out / "model.safetensors", b"weights")
    with session():
        run = claim(out, "train", "vit_tiny", resume=True)
        assert run.files == {"model.safetensors"} and run.records["model.safetensors"].size == 7
    (out / "model.safetensors").write_bytes(b"other!!")
    with pytest.raises(InputError, match="cannot prove"):
        claim(out, "train", "vit_tiny", resume=True)
    assert (out / "model.safetensors").read_bytes() == b"other!!"


def test_an_appended_log_is_recorded_without_reading_it_again(tmp_path, monkeypatch) -> None:
    from vitreg.core import manifest
    from vitreg.train.log import append_record

    reads = []
    real = manifest.Digest.of_file
    monkeypatch.setattr(manifest.Digest, "of_file", lambda p: reads.append(p) or real(p))
    out = tmp_path / "run"
    with session():
        claim(out, "train", "vit_tiny", resume=True)
        for step in range(1, 4):
            append_record(out / "log.jsonl", {"step": step})
    assert len(reads) == 1  # the first append only; the next ones carry the hash on
    want = Record.of_bytes((out / "log.jsonl").read_bytes())
    assert read_manifest(out).records["log.jsonl"] == want
    with session():  # resumed by a new process: the log is read once, then carried on
        claim(out, "train", "vit_tiny", resume=True)
        append_record(out / "log.jsonl", {"step": 4})
        append_record(out / "log.jsonl", {"step": 5})
    assert len(reads) == 3 and read_manifest(out).records["log.jsonl"].matches(out / "log.jsonl")
