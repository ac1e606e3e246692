"""The CLI's :class:`~vitreg.progress.Progress`: rich bars on stderr in a terminal, plain lines
when stderr is not a terminal (a log file, a pipe, CI), one style for every command and phase.
``VITREG_PROGRESS=plain`` asks for the lines in a terminal too, ``off`` for no progress at all.
A label ending in its unit in brackets, ``extracting features (samples)``, counts in that unit:
``extracting features: done, 200/200 samples in 3.1 s``."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.text import Text

from vitreg.cli.output import err_console
from vitreg.progress import Update

LOG_EVERY = 5.0  # seconds between two plain lines of one phase
REDRAW_EVERY = 0.1  # seconds between two forced redraws of a bar (rich also redraws at 10 Hz)
SHOW_DONE = 1.0  # a nested phase shorter than this ends without a line


def mode() -> str:
    """``VITREG_PROGRESS``: ``auto`` (bars in a terminal, else lines), ``plain`` or ``off``."""
    value = os.environ.get("VITREG_PROGRESS", "auto").strip().lower()
    return value if value in ("auto", "plain", "off") else "auto"


def split_unit(label: str) -> tuple[str, str]:
    """``"extracting features (samples)"`` -> ``("extracting features", "samples")``; a label
    without a bracketed unit at its end counts bare steps (``""``)."""
    m = re.fullmatch(r"(.*\S)\s+\(([^()]+)\)", label.strip())
    return (m.group(1), m.group(2)) if m else (label, "")


def status_text(status: dict[str, float | str]) -> str:
    """``{"loss": 0.31234, "lr": "1.0e-03"}`` -> ``loss=0.3123 lr=1.0e-03``."""
    shown = (f"{v:.4g}" if isinstance(v, float) else str(v) for v in status.values())
    return " ".join(f"{k}={v}" for k, v in zip(status, shown, strict=True))


class _Count(ProgressColumn):
    """``done/total unit``, or ``done unit`` while the total is unknown."""

    def render(self, task: Task) -> Text:
        done = int(task.completed)
        count = f"{done}/{int(task.total)}" if task.total is not None else f"{done}"
        unit = task.fields.get("unit", "")
        return Text(f"{count} {unit}" if unit else count)


class _Phase:
    """One phase's state: its steps, status and clock."""

    def __init__(self, total: int | None, label: str, outer: bool) -> None:
        self.total, self.outer = total, outer
        self.label, self.unit = split_unit(label)
        self.done, self.status = 0, ""
        self.start = self.last_line = time.monotonic()

    def count(self) -> str:
        """``done/total unit``; ``done unit`` when the total is unknown; empty before any step
        of that."""
        if self.total is None:
            count = str(self.done) if self.done else ""
        else:
            count = f"{self.done}/{self.total}"
        return f"{count} {self.unit}" if count and self.unit else count

    def line(self, end: bool = False) -> str:
        """The plain-text state: ``label: 5/17 (29%) loss=0.3`` or, at the end, with the time."""
        count = self.count()
        if end:
            took = f"in {time.monotonic() - self.start:.1f} s"
            text = f"{self.label}: done, {count} {took}" if count else f"{self.label}: done {took}"
            if self.total is not None and self.done < self.total:  # ended at its real last step
                done = f"{self.done} {self.unit}" if self.unit else str(self.done)
                text = f"{self.label}: done, {done} {took} (ended early; {self.total} planned)"
        elif count:
            text = f"{self.label}: {count}"
            text += f" ({self.done / self.total:.0%})" if self.total else ""
        else:
            text = f"{self.label} ..."
        return text + (f" {self.status}" if self.status else "")

    def shows_end(self) -> bool:
        return self.outer or time.monotonic() - self.start >= SHOW_DONE


class ConsoleProgress:
    """Progress phases on ``console``: a live rich bar per phase in a terminal (nested phases
    share one display, redrawn at most every ``redraw`` seconds), else a line every ``every``
    seconds of a phase and one at its end (none at its start: an error is the first line). A phase that ends before its total (an early
    stop) is shown ending at its real last step."""

    def __init__(
        self, console: Console, every: float = LOG_EVERY, redraw: float = REDRAW_EVERY
    ) -> None:
        self.console = console
        self.every = every
        self.redraw = redraw
        self._bars: RichProgress | None = None
        self._depth = 0

    @contextmanager
    def __call__(self, total: int | None, label: str) -> Iterator[Update]:
        if self.silent():
            yield lambda done, **status: None
            return
        phase = _Phase(total, label, outer=self._depth == 0)
        self._depth += 1
        try:
            if self.console.is_terminal and mode() == "auto":
                with self._bar(phase) as update:
                    yield update
            else:
                with self._lines(phase) as update:
                    yield update
        finally:
            self._depth -= 1

    def note(self, message: str) -> None:
        """One line (above the bars in a terminal)."""
        if not self.silent():
            self.console.print(escape(message), soft_wrap=not self.console.is_terminal)

    def silent(self) -> bool:
        """No progress: asked for (``VITREG_PROGRESS=off``) or another torchrun rank."""
        return self.console.quiet or mode() == "off"

    @contextmanager
    def _bar(self, phase: _Phase) -> Iterator[Update]:
        if self._bars is None:
            columns = (TextColumn("{task.description}"), BarColumn(), _Count(), TimeElapsedColumn())
            status = TextColumn("{task.fields[status]}")
            self._bars = RichProgress(*columns, status, console=self.console, transient=True)
            self._bars.start()
        bars = self._bars
        task = bars.add_task(escape(phase.label), total=phase.total, status="", unit=phase.unit)

        def update(done: int, **status: float | str) -> None:
            phase.done, phase.status = done, status_text(status) if status else phase.status
            now = time.monotonic()
            redraw = now - phase.last_line >= self.redraw
            phase.last_line = now if redraw else phase.last_line
            bars.update(task, completed=done, status=escape(phase.status), refresh=redraw)

        try:
            yield update
            if phase.total is not None and phase.done < phase.total:  # its real last step
                bars.update(task, total=phase.done, completed=phase.done)
            if phase.shows_end():
                self.console.print(f"[green]✓[/green] {escape(phase.line(end=True))}")
        finally:
            bars.remove_task(task)
            if phase.outer:
                bars.stop()
                self._bars = None

    @contextmanager
    def _lines(self, phase: _Phase) -> Iterator[Update]:
        def update(done: int, **status: float | str) -> None:
            phase.done, phase.status = done, status_text(status) if status else phase.status
            now = time.monotonic()
            if now - phase.last_line >= self.every:
                phase.last_line = now
                self.console.print(escape(phase.line()), soft_wrap=True)

        yield update
        if phase.shows_end():
            self.console.print(escape(phase.line(end=True)), soft_wrap=True)


progress = ConsoleProgress(err_console)
