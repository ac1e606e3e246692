"""The last hostile inputs that ended in "this is a bug" or said the wrong thing, one test per
class: each is exit 2 with one paragraph naming the cause, or a counted, reported skip."""

from __future__ import annotations

from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app

runner = CliRunner()


def test_config_duplicate_key_and_boolean_number_are_refused_with_the_key(tmp_path) -> None:
    twice = tmp_path / "twice.yaml"
    twice.write_text("verb: diagnose\nlimit: 3\nlimit: 5\n")
    result = runner.invoke(app, ["diagnose", "--config", str(twice), "--out", str(tmp_path / "a")])
    assert_clean_failure(result, "'limit' twice", "line 3")
    flag = tmp_path / "flag.yaml"
    flag.write_text("verb: diagnose\nlimit: true\n")
    result = runner.invoke(app, ["diagnose", "--config", str(flag), "--out", str(tmp_path / "b")])
    assert_clean_failure(result, "limit is true, but limit is a number")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
