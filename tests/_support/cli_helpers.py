"""Helpers of the CLI tests: rich's wrapping undone, what a clean input error looks like, and
``vitreg`` run on a real pseudo-terminal."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from conftest import HANG_GUARD_S

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def flat(text: str) -> str:
    """Text with rich's line wrapping undone."""
    return " ".join(text.split())


def assert_clean_failure(result, *needles: str) -> str:
    """Exit code 2, a one-paragraph ``error:`` on stderr naming every needle, no traceback;
    returns the error as one line."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    err = result.stderr.strip()
    assert err.startswith("error:") and "Traceback" not in result.output, result.output
    assert "\n\n" not in err  # one paragraph
    bare = "".join(err.split())  # rich may wrap a long path anywhere
    for needle in needles:
        assert needle in flat(err) or "".join(needle.split()) in bare, flat(err)
    return flat(err)


def run_on_pty(
    args: list[str], columns: int = 140, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """``vitreg ARGS`` in a subprocess whose stdout and stderr are a pseudo-terminal of
    ``columns`` columns (rich finds a terminal: live bars, its own wrapping); (exit code, all it
    wrote, escape codes included)."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "VITREG_PROGRESS": "auto", "COLUMNS": str(columns), **(env or {})}
    code = "from vitreg.cli.app import main; main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the pty closes when the process exits
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=HANG_GUARD_S), b"".join(chunks).decode(errors="replace")


def refuse_model_loading(monkeypatch) -> None:
    """Make any command that starts loading a model fail the test (``--out`` is checked first)."""
    from vitreg.verbs import loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before --out was checked")

    monkeypatch.setattr(loading, "load_spec", refuse)


def files_of(out) -> dict[str, bytes]:
    """Every file under ``out``, its bytes by name."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
