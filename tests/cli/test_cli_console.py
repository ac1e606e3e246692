"""The console as a user sees it: `--help` and `--version` without torch, help wrapped at word
boundaries, paths and commands on lines that are never wrapped, a unit in every "done" line, and
the Hugging Face libraries' own progress bars kept off."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from _support.cli_helpers import ANSI, run_on_pty
from conftest import HANG_GUARD_S
from vitreg.cli.command import unwrapped
from vitreg.cli.progress import split_unit

HEAVY = ("torch", "timm", "transformers")
WIDTH = 100


def modules_after(argv: list[str]) -> dict[str, bool]:
    """Which heavy libraries ``vitreg ARGV`` imported, run in a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from vitreg.cli.app import main\n"
        f"sys.argv = ['vitreg', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["probe", "--help"]])
def test_help_and_version_import_no_torch(argv):
    assert modules_after(argv) == dict.fromkeys(HEAVY, False)


def test_the_hugging_face_progress_bars_are_off_once_a_command_runs():
    code = (
        "import sys\n"
        "from vitreg.cli.app import main\n"
        "sys.argv = ['vitreg', 'models', '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "from huggingface_hub.utils import are_progress_bars_disabled\n"
        "print(are_progress_bars_disabled())"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S, env=env
    )
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr


def test_docstrings_lose_their_source_line_breaks_but_keep_paragraphs():
    assert unwrapped(
        "Merge the runs: run, metric, value,\n    direction (folders that\n    are not runs)."
    ) == ("Merge the runs: run, metric, value, direction (folders that are not runs).")
    assert unwrapped("One.\n\nTwo\nthree.") == "One.\n\nTwo three."


def test_a_count_takes_the_unit_in_brackets_at_the_end_of_its_label():
    assert split_unit("extracting features base/train (samples)") == (
        "extracting features base/train",
        "samples",
    )
    assert split_unit("writing the report") == ("writing the report", "")


def _early_breaks(text: str) -> list[str]:
    """Lines of rich's help panels broken before a word that would have fit on them."""
    lines = ANSI.sub("", text).replace("\r", "").splitlines()
    found = []
    for line, nxt in zip(lines, lines[1:], strict=False):
        if not (line.startswith("│") and nxt.startswith("│") and line.endswith("│")):
            continue
        body, rest = line[1:-1].rstrip(), nxt[1:-1]
        # a continuation: the first columns (the name column) are blank
        if not rest[:12].strip() and rest.strip() and not rest.strip().startswith("["):
            word = rest.split()[0]
            if len(body) + 1 + len(word) <= len(line) - 3:
                found.append(f"{body!r} + {word!r}")
    return found


@pytest.mark.parametrize("argv", [["--help"], ["probe", "--help"], ["compare", "--help"]])
def test_help_on_a_100_column_terminal_wraps_at_word_boundaries(argv):
    code, text = run_on_pty(argv, columns=WIDTH)
    assert code == 0, text
    plain = ANSI.sub("", text)
    assert "…" not in plain  # no option's help cut short
    assert "Usage:" in plain and not _early_breaks(text), _early_breaks(text)
    if argv == ["probe", "--help"]:
        assert "synthetic-boxes" in plain and "seed=0" in plain  # the --data line, whole


@pytest.mark.slow
def test_neurons_on_a_100_column_terminal_pastes_whole_and_counts_in_units(tmp_path):
    """`vitreg neurons` on a pty: the run directory and the `next:` command each on one line
    (rich's soft wrap: the terminal folds them, a paste gets them whole), and every "done" line
    says what it counted."""
    out = tmp_path / "a-rather-long-folder-name-for-the-run" / "so-that-the-paths-pass-100-columns"
    code, text = run_on_pty(["neurons", "--img-size", "112", "--out", str(out)], columns=WIDTH)
    assert code == 0, text
    plain = ANSI.sub("", text).replace("\r", "")
    command = f"next: vitreg fix planted:dinov2_s14 --neurons {out / 'neurons.json'}"
    assert len(command) > WIDTH and command in plain.splitlines(), plain
    assert f"run directory: {out}" in plain.splitlines()
    done = re.findall(r"done, (\d+(?:/\d+)?) (\S+)", plain)
    assert done and all(unit != "in" for _, unit in done), done
    assert {unit for _, unit in done} >= {"images"}
