"""House rules of ``src/vitreg`` that no single package owns: results typed rather than passed as
``dict[str, Any]``, functions short enough to read as the steps they are, comments and docstrings
that say the rule they guard (never the issue that asked for it), and the dead code gone."""

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
KNOWN_LONG: set[str] = set()


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


#: a mapping whose keys the type does not name: ``dict[str, Any]``, its spellings with
#: ``Mapping``/``object``, and a bare ``dict`` or ``Mapping``
UNTYPED = re.compile(
    r"\b(dict|Dict|Mapping|MutableMapping)\[str, (Any|object)\]|\b(dict|Dict|Mapping)\b(?!\[)"
)
#: parameters that hold a user's own data, whose keys vitreg does not define (a task's or a
#: recipe's options, a model constructor's keyword arguments, a model's config file)
USERS_OWN = {
    "models/input_size.py:check_requested_size(kwargs)",
    "probe/run.py:run(task_options)",
    "probe/tasks/attention_seg.py:AttentionSeg.setup(options)",
    "probe/tasks/ov_seg.py:OvSeg.setup(options)",
    "probe/tasks/pruning.py:Pruning.setup(options)",
    "probe/tasks/zero_shot.py:ZeroShot.setup(options)",
    "probe/tasks/model_task.py:ModelTask.setup(options)",
    "probe/zero_shot/runner.py:run_model_task(options)",
    "train/recipe.py:parse_options(options)",
    "train/loop.py:train(model_kwargs)",
    "train/loop.py:train(options)",
    "train/loop.py:train(model_or_spec)",
    "train/model.py:build_model(kwargs)",
    "train/model.py:describe(kwargs)",
    "train/model.py:refuse_file_args(kwargs)",
    "train/model.py:check_build(build)",
    # torch's own optimizer state_dict, rebuilt for ``Optimizer.load_state_dict``
    "train/checkpoint.py:optimizer_state(return)",
    # a hub model card's own YAML metadata, as huggingface_hub's ModelCardData reads it
    "neurons/hub.py:read_metadata(return)",
    "models/loaders/local.py:check_size(kwargs)",
    "models/loaders/local.py:check_size(model_args)",
    "models/loaders/local.py:check_size(args)",
    "models/loaders/timm_source.py:size_from_weights(kwargs)",
    "models/loaders/timm_source.py:timm_notes(kwargs)",
    # the run's resolved config, the user's own values (kept as JSON, paths as text)
    "core/checkpoint.py:check_identity(identity)",
    "core/checkpoint.py:resumable(identity)",
    # a module's own globals()
    "core/renamed.py:renamed(namespace)",
    # the keyword arguments a source library's attention module was called with (rope, masks)
    "hooks/attention.py:capture_qk(compute)",
    "models/adapters/timm_eva.py:rope_pattern(return)",
    # timm's data config (its keys are timm's create_transform arguments), built from the model's own preprocessing config
    "models/adapters/base.py:Adapter.data_config(return)",
    "models/adapters/hf.py:HFCLIPAdapter.data_config(return)",
    "models/adapters/hf.py:HFDinov2Adapter.data_config(return)",
    "models/adapters/hf.py:HFSiglipAdapter.data_config(return)",
    "models/adapters/open_clip.py:OpenClipViTAdapter.data_config(return)",
    "models/adapters/timm_vit.py:TimmViTAdapter.data_config(return)",
    # a local model folder's own config.json
    "models/loaders/local.py:read_config(return)",
    # typer's parameter values of the command line
    "cli/options.py:resolve_config(params)",
    # a user's config.yaml values (and the command line's) before validation: PyYAML's safe
    # loader may give any key, dates, sets or bytes, which the config model then refuses
    "configs.py:read_config(return)",
    "configs.py:build_config(values)",
    # the constructor arguments of the user's timm model, read from its own config.json
    "verbs/fix.py:save_args(return)",
    # a model's variant config with timm.create_model's own keyword arguments as given (any value)
    "arch/config.py:VariantConfig.as_dict(return)",
}


def untyped_signatures(root: Path) -> set[str]:
    """``file:function(parameter)`` (``(return)`` for the result) of every public function or
    method under ``root`` whose annotation holds ``dict[str, Any]``."""
    found: set[str] = set()

    def visit(body: list[ast.stmt], file: str, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, file, f"{prefix}{node.name}.")
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("_") and not node.name.endswith("__"):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            named = [(p.arg, p.annotation) for p in params] + [("return", node.returns)]
            for name, annotation in named:
                if annotation is not None and UNTYPED.search(ast.unparse(annotation)):
                    found.add(f"{file}:{prefix}{node.name}({name})")

    for path in sorted(root.rglob("*.py")):
        visit(
            ast.parse(path.read_text(encoding="utf-8")).body, path.relative_to(root).as_posix(), ""
        )
    return found


def test_public_signatures_take_and_return_typed_results() -> None:
    found = untyped_signatures(SRC)
    untyped = sorted(found - USERS_OWN)
    assert not untyped, "type these (a results model, a settings part) or name why not:\n" + (
        "\n".join(untyped)
    )
    gone = sorted(USERS_OWN - found)
    assert not gone, "a user's-own-data entry no longer exists:\n" + "\n".join(gone)


def test_the_signature_check_finds_untyped_parameters_and_results(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from typing import Any\n"
        "def f(a: dict[str, Any], b: int) -> dict[str, Any]: ...\n"
        "def _hidden(a: dict[str, Any]) -> None: ...\n"
        "class C:\n"
        "    def m(self, *, x: list[dict[str, Any]] | None = None) -> None: ...\n"
        "    def typed(self, y: dict[str, int]) -> None: ...\n"
        "    def bare(self, z: dict) -> Mapping[str, Any]: ...\n"
        "    def obj(self, w: dict[str, object]) -> Iterator[dict]: ...\n"
        "    def fine(self, v: dict[str, list[int]], u: Dictionary) -> None: ...\n"
    )
    assert untyped_signatures(tmp_path) == {
        "m.py:f(a)",
        "m.py:f(return)",
        "m.py:C.m(x)",
        "m.py:C.bare(z)",
        "m.py:C.bare(return)",
        "m.py:C.obj(w)",
        "m.py:C.obj(return)",
    }
