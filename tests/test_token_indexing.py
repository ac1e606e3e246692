"""Token arithmetic goes through TokenLayout: no ``[:, 0]`` as [CLS], ``[:, 1:]`` as patches,
``num_prefix_tokens`` offsets or prefix slices anywhere in ``src/vitreg`` but ``core/layout.py``.

A line that must keep such an index (the source model's own bookkeeping, a tensor whose second
axis is not tokens) says why in a ``# layout:`` comment, on the line or the line above.
Strings and comments are not code, so docstrings may name these patterns freely.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import vitreg

SRC = Path(vitreg.__file__).parent
ALLOWED_FILES = {"core/layout.py"}
MARK = "layout:"

PATTERNS = {
    "[:, 0]": re.compile(r"\[\s*:\s*,\s*0\s*\]"),
    "[:, 1:]": re.compile(r"\[\s*:\s*,\s*1\s*:\s*\]"),
    # x[:, :n], x[:, n:], x[:, a : b, ...] (tokens second), t[:, :, :n] (heads, then tokens)
    "a counted slice of the token axis": re.compile(
        r"\[\s*:\s*,\s*(?::\s*[A-Za-z_]|[A-Za-z_][\w.]*\s*:)"
        r"|\[\s*:\s*,\s*:\s*,\s*(?::\s*[A-Za-z_][^],]*|[A-Za-z_][\w.]*\s*:[^],]*)\]"
    ),
    "num_prefix_tokens": re.compile(r"\bnum_prefix_tokens\b"),
}


def code_lines(text: str) -> tuple[dict[int, str], dict[int, str]]:
    """(code with strings blanked, comment) per line number."""
    lines = text.splitlines()
    code = {i + 1: line for i, line in enumerate(lines)}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
            row, col = tok.start
            code[row] = code[row][:col]
        elif tok.type in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)):
            (r0, c0), (r1, c1) = tok.start, tok.end
            for row in range(r0, r1 + 1):
                line = code[row]
                start = c0 if row == r0 else 0
                end = c1 if row == r1 else len(line)
                code[row] = line[:start] + " " * (end - start) + line[end:]
    return code, comments


def unexplained(path: Path, name: str) -> list[str]:
    """Lines of ``path`` that index tokens by hand without a ``# layout:`` reason."""
    code, comments = code_lines(path.read_text(encoding="utf-8"))
    found = []
    for row, line in code.items():
        hits = [what for what, pattern in PATTERNS.items() if pattern.search(line)]
        own = MARK in comments.get(row, "")
        above = not code.get(row - 1, "").strip() and MARK in comments.get(row - 1, "")
        if hits and not (own or above):
            found.append(f"{name}:{row}: {', '.join(hits)}: {line.strip()}")
    return found


def test_token_indexing_goes_through_token_layout() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        if name not in ALLOWED_FILES:
            found += unexplained(path, name)
    assert not found, (
        "index tokens through TokenLayout (cls_token, take, insert, prefix/patches slices) or "
        "say why not in a '# layout:' comment:\n" + "\n".join(found)
    )


def test_the_check_flags_hand_made_token_indices(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        '"""x[:, 0] in a docstring is fine."""\n'
        "cls = x[:, 0]\n"
        "patches = x[:, 1:]\n"
        "rest = x[:, model.num_prefix_tokens :]\n"
        "head = t[:, :, :n]\n"
        "ok = x[:, 0]  # layout: channel axis of a conv output, not tokens\n"
        "# layout: the source's own bookkeeping\n"
        "model.num_prefix_tokens = n\n"
        "units = t[:, :, idx]\n"
        "kept = layout.take(x, 'patches')\n"
    )
    assert [line.split(":")[1] for line in unexplained(path, "m.py")] == ["2", "3", "4", "5"]
