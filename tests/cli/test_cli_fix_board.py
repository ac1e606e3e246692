"""``vitreg fix --method``: a method other than plain ttr writes the leaderboard on a planted
CLIP; unknown or non-composing methods fail before any model loads."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--method", "nope"], "unknown fix method 'nope'"),
        (["--method", "naclip+sclip"], "at most one"),
        (["--method", "naclip", "--probe", "nope:voc:x"], "TASK:DATA"),
    ],
)
def test_bad_methods_and_probes_fail_before_loading(args, needle):
    result = runner.invoke(app, ["fix", "planted:clip_t16", *args])
    assert_clean_failure(result, needle)


@pytest.mark.slow  # builds the planted CLIP (about 10 s on a shared CPU)
def test_last_block_methods_write_a_leaderboard_on_a_planted_clip(tmp_path):
    out = tmp_path / "board"
    args = ["fix", "planted:clip_t16", "--method", "naclip", "--img-size", "64"]
    result = runner.invoke(app, [*args, "--limit", "2", "--batch-size", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "leaderboard.json").read_text())
    assert [r["entry"] for r in doc["board"]["rows"]] == ["none", "naclip"]
    assert doc["synthetic"] and doc["board"]["n_images"] == 2
    assert (out / "leaderboard.md").read_text().startswith("**SYNTHETIC MODEL:**")
    assert "leaderboard" in result.output
