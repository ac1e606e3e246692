"""The CLI's progress: moving rich bars in a terminal (train steps with loss and lr, probe fits
with their early stop), plain lines when stderr is not a terminal, phases that end at their real
last step, and the feature cache announcing its hits."""

from __future__ import annotations

import io
import re
from contextlib import contextmanager

import pytest
import timm
import torch
from rich.console import Console
from typer.testing import CliRunner

import vitreg
from _support.cli_helpers import ANSI, run_on_pty
from _support.train_helpers import run as train_tiny
from vitreg.cli import progress as cli_progress
from vitreg.cli.app import app
from vitreg.cli.progress import ConsoleProgress
from vitreg.probe.linear import FitSettings, fit_linear
from vitreg.probe.run import run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def progress_on(monkeypatch):
    """Progress as users get it (the suite turns it off for tests that read stderr)."""
    monkeypatch.setenv("VITREG_PROGRESS", "auto")


def terminal() -> tuple[ConsoleProgress, io.StringIO]:
    """A progress on a forced terminal that redraws at every update (the test sees each frame)."""
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=140, color_system=None)
    return ConsoleProgress(console, redraw=0.0), buf


def counts(text: str, total: int) -> set[int]:
    """Every ``n/total`` drawn on the bar."""
    return {int(m) for m in re.findall(rf"(\d+)/{total}\b", ANSI.sub("", text))}


def test_train_in_a_terminal_draws_a_moving_bar_with_loss_and_lr(tmp_path, monkeypatch):
    shown, buf = terminal()
    monkeypatch.setattr(cli_progress, "progress", shown)  # what every command reports through
    tiny = ["depth=1", "embed_dim=32", "num_heads=2", "patch_size=8"]
    args = ["train", "vit_tiny_patch16_224", "--img-size", "16", "--data", "synthetic-cls:n=8"]
    args += [a for kv in tiny for a in ("--model-arg", kv)]
    args += ["--steps", "4", "--batch-size", "4", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = buf.getvalue()
    assert "━" in text and "\x1b[" in text  # a live bar, redrawn in place
    assert counts(text, 4) >= {1, 2, 3, 4}  # it moved through every step
    assert re.search(r"loss=\d+\.\d{4} lr=\d\.\d\de[-+]\d\d", ANSI.sub("", text))
    assert "training: done, 4/4 optimizer steps in" in ANSI.sub("", text)


def test_probe_fit_in_a_terminal_shows_its_epochs_and_early_stop():
    shown, buf = terminal()
    torch.manual_seed(0)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))  # noise: held-out loss stops falling
    config = FitSettings(epochs=40, patience=1, seeds=(0,), progress=shown)
    fit = fit_linear(x, y, "ce", out_dim=3, config=config)
    text = ANSI.sub("", buf.getvalue())
    stopped = max(fit.epochs_run)
    assert stopped < 40 and counts(text, 40) >= set(range(1, stopped + 1))
    assert "improving=" in text and f"early_stop=epoch {stopped}" in text
    # the bar ends at its real last step, not at stopped/40
    assert f"done, {stopped} epochs in" in text and "(ended early; 40 planned)" in text


def test_not_a_terminal_gets_plain_lines():
    buf = io.StringIO()
    plain = ConsoleProgress(Console(file=buf, width=200), every=0.0)
    with plain(17, "checking the fix") as update:
        for k in range(1, 6):
            update(k, status="ok")
    with plain(None, "writing the report"):
        pass
    lines = buf.getvalue().splitlines()
    assert "\x1b" not in buf.getvalue() and "━" not in buf.getvalue()
    assert lines[:5] == [f"checking the fix: {k}/17 ({k / 17:.0%}) status=ok" for k in range(1, 6)]
    assert re.fullmatch(
        r"checking the fix: done, 5 in \d+\.\d s \(ended early; 17 planned\) status=ok", lines[5]
    )
    assert re.fullmatch(r"writing the report: done in \d+\.\d s", lines[6])
    assert len(lines) == 7


class Recorder:
    """A Progress that keeps every phase label, its last step and every note."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, int | None, int]] = []
        self.notes: list[str] = []

    @contextmanager
    def __call__(self, total, label):
        seen = [0]
        yield lambda done, **status: seen.__setitem__(0, done)
        self.phases.append((label, total, seen[0]))

    def note(self, message: str) -> None:
        self.notes.append(message)


def test_probe_run_reports_real_totals_and_cache_hits(tmp_path):
    torch.manual_seed(0)
    module = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=8, depth=1
    )
    model = vitreg.wrap(module.eval())
    data, cache = "synthetic-cls:n=12,size=16", tmp_path / "cache"
    config = FitSettings(seeds=(0,), epochs=2)
    first, second = Recorder(), Recorder()
    for seen in (first, second):
        run(model, "classification", data, cache_dir=cache, config=config, progress=seen)
    extraction = [p for p in first.phases if p[0].startswith("extracting features")]
    assert [(total, done) for _, total, done in extraction] == [(12, 12), (12, 12)]
    assert any(label.startswith("probe fit") and total == 2 for label, total, _ in first.phases)
    fits = [label for label, _, _ in first.phases if label.startswith("probe fit")]
    assert {label.split(",")[0] for label in fits} >= {"probe fit cls", "probe fit patch_mean"}
    assert all(label.endswith("(epochs)") for label in fits)  # the unit of the count
    assert first.notes == []
    assert len(second.notes) == 2 and all(
        n.startswith("cache hit: 12 features, 0 forward passes") for n in second.notes
    )


def test_train_steps_become_one_phase_with_loss_and_lr(tmp_path):
    seen = Recorder()
    train_tiny("supervised", tmp_path / "a", steps=3, progress=seen)
    assert seen.phases == [("training (optimizer steps)", 3, 3)]
    again = Recorder()  # a finished run trained again takes no step: no phase
    train_tiny("supervised", tmp_path / "a", steps=3, progress=again)
    assert again.phases == []
    buf = io.StringIO()
    plain = ConsoleProgress(Console(file=buf, width=200), every=0.0)
    train_tiny("supervised", tmp_path / "b", steps=1, progress=plain, label="training")
    status = buf.getvalue().strip().splitlines()[0]
    assert re.fullmatch(r"training: 1/1 \(100%\) loss=\d+\.\d{4} lr=\d\.\d\de-\d\d", status), status


def test_a_real_pseudo_terminal_sees_the_train_bar_move(tmp_path):
    """`vitreg train` in a subprocess whose stderr is a pty: rich finds a terminal and redraws."""
    tiny = ["depth=1", "embed_dim=32", "num_heads=2", "patch_size=8"]
    args = ["train", "vit_tiny_patch16_224", "--img-size", "16", "--data", "synthetic-cls:n=8"]
    args += [a for kv in tiny for a in ("--model-arg", kv)]
    args += ["--steps", "6", "--batch-size", "4", "--out", str(tmp_path / "run")]
    code, text = run_on_pty(args)
    assert code == 0, text
    assert "━" in text and "\x1b[" in text  # a live bar, redrawn in place
    assert len(counts(text, 6)) >= 2  # drawn at more than one step
    assert "done, 6/6 optimizer steps" in ANSI.sub("", text)
