"""Hostile run directories on the CLI (issue 24): a config that sets overwrite, an --out holding
the user's own files, and a second run into a folder another run holds -- each refused with
exit 2 before any model loads, every file left as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure, files_of, refuse_model_loading
from vitreg.cli.app import app
from vitreg.core.io import write_bytes_atomic, write_text_atomic
from vitreg.core.out_dir import check_out
from vitreg.core.run_dir import session
from vitreg.train.log import append_record

runner = CliRunner()
TRAIN = ["train", "vit_tiny_patch16_224", "--model-arg", "depth=1", "--model-arg", "embed_dim=64",
         "--model-arg", "num_heads=2", "--img-size", "32", "--batch-size", "4",
         "--data", "synthetic-cls:n=8,size=32", "--steps", "2"]  # fmt: skip


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    """Fail the test if any command starts loading a model."""
    refuse_model_loading(monkeypatch)


def train_run(out: Path) -> dict[str, bytes]:
    """A train run's files (written under its claim); their bytes by name."""
    with session():
        check_out(out, "train", "vit_tiny_patch16_224")
        for name in ("checkpoints/step-00000002.safetensors", "model.safetensors"):
            write_bytes_atomic(out / name, b"weights")
        write_text_atomic(out / "train.json", "{}")
        append_record(out / "log.jsonl", {"step": 2})
    return files_of(out)


def test_overwrite_in_a_config_file_is_an_error_and_deletes_nothing(tmp_path) -> None:
    run = tmp_path / "train"
    before = train_run(run)
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"verb": "diagnose", "out": str(run), "overwrite": True}))
    result = runner.invoke(app, ["diagnose", "--config", str(config)])
    assert_clean_failure(result, "sets overwrite", "pass --overwrite on the command line")
    assert files_of(run) == before and "checkpoints/step-00000002.safetensors" in before


def test_an_out_with_the_users_own_files_is_refused_even_with_overwrite(tmp_path) -> None:
    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    (out / "report.md").write_text("my notes")
    (out / "figures" / "norm_maps.png").write_bytes(b"my figure")
    for extra in ([], ["--overwrite"]):
        result = runner.invoke(app, ["diagnose", "--out", str(out), *extra])
        assert_clean_failure(result, "files vitreg did not write", "figures/norm_maps.png")
    assert (out / "report.md").read_text() == "my notes"
    assert (out / "figures" / "norm_maps.png").read_bytes() == b"my figure"


def test_a_second_train_run_is_refused_naming_the_first_and_never_interleaves(tmp_path) -> None:
    out = tmp_path / "run"
    with session():
        check_out(out, "train", "vit_tiny_patch16_224")  # the first run, still going
        append_record(out / "log.jsonl", {"step": 1})
        result = runner.invoke(app, [*TRAIN, "--out", str(out)])
        assert_clean_failure(result, "in use by another vitreg run", f"pid {os.getpid()}")
        assert (out / "log.jsonl").read_text().splitlines() == ['{"step": 1}']


def test_fix_save_into_a_folder_of_the_users_own_files_is_refused(tmp_path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    args = ["fix", "--neurons", "builtin", "--out", str(tmp_path / "run"), "--save", str(mine)]
    result = runner.invoke(app, args)
    assert_clean_failure(result, "files vitreg did not write", "config.json")
    assert (mine / "config.json").read_text() == '{"mine": true}'
    assert not (tmp_path / "run").exists()  # the --out claimed first is left as it was
