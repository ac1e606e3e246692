"""House rules of ``src/vitreg`` that no single package owns: functions short enough to read as
the steps they are, comments and docstrings that say the rule they guard (never the issue that
asked for it), and the dead code gone."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import vitreg

SRC = Path(vitreg.__file__).parent
#: a project issue named in prose: "issue 24", "issues 18 and 25", "issue-20 analyses", "issue #7"
ISSUE = re.compile(r"\bissues? ?#?\d|\bissue-\d", re.IGNORECASE)


def notes(text: str) -> Iterator[tuple[int, str]]:
    """Every comment and docstring of a module's ``text``: (line, text)."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    yield body[0].lineno, body[0].value.value


def issue_numbers(root: Path) -> list[str]:
    """``file:line: text`` of each comment or docstring under ``root`` that names an issue."""
    return [
        f"{path.relative_to(root.parent)}:{line}: {text.strip()[:80]}"
        for path in sorted(root.rglob("*.py"))
        for line, text in notes(path.read_text(encoding="utf-8"))
        if ISSUE.search(text)
    ]


def test_no_comment_or_docstring_names_an_issue() -> None:
    found = issue_numbers(SRC)
    assert not found, "say the rule, not the issue:\n" + "\n".join(found)


def test_the_check_finds_issue_numbers_in_comments_and_docstrings(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text(
        '"""Module (issue 18)."""\n\n'
        "def f():\n"
        '    """Fine: see facebookresearch/dinov2#373."""\n'
        "    x = 'issue 5 in a string is data'  # issues 18 and 25\n"
        "    return x  # the issue-20 kinds\n"
    )
    assert issue_numbers(root) == [
        "pkg/a.py:5: # issues 18 and 25",
        "pkg/a.py:6: # the issue-20 kinds",
        "pkg/a.py:1: Module (issue 18).",
    ]


def test_dead_code_and_unused_dependencies_stay_gone() -> None:
    from conftest import ROOT

    deps = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"tqdm"' not in deps, "nothing in vitreg imports tqdm"
    assert not any("tqdm" in n for _, n in _imports(SRC)), "tqdm is no dependency"
    from vitreg.neurons import hub

    assert not hasattr(hub, "is_hub"), "is_hub had no caller"


def _imports(root: Path) -> Iterator[tuple[Path, str]]:
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                yield from ((path, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                yield path, node.module


LONGEST = 100  # lines: a function longer than this is split along the steps its docstring names
#: functions still over the limit; an entry that no longer is fails the test, so the list shrinks
KNOWN_LONG: set[str] = {
    "neurons/auto.py:find_neurons",
    "neurons/causal.py:select_causal",
    "neurons/causal.py:_prune",
    "neurons/discover.py:discover",
}


def long_functions(root: Path, limit: int = LONGEST) -> dict[str, int]:
    """``file:name`` -> length in lines of every function (or method) under ``root`` longer
    than ``limit``, decorators excluded."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found[f"{path.relative_to(root).as_posix()}:{node.name}"] = length
    return found


def test_no_function_is_over_a_hundred_lines() -> None:
    found = long_functions(SRC)
    new = {k: v for k, v in found.items() if k not in KNOWN_LONG}
    assert not new, "split along the steps it names:\n" + "\n".join(
        f"{k}: {v} lines" for k, v in sorted(new.items(), key=lambda kv: -kv[1])
    )
    assert KNOWN_LONG <= set(found), f"now short, drop from KNOWN_LONG: {KNOWN_LONG - set(found)}"


def test_the_length_check_counts_lines_from_def_to_the_last(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path) == {"m.py:long": 101}
    assert long_functions(tmp_path, limit=101) == {}
