"""One record per verb: every table of verbs (the CLI's commands, config.yaml's reader, the
metrics.json schema, the renderers, the folders that resume) is read from ``VERBS``, and no
verb's config, results model or renderer is listed anywhere else in ``src/vitreg``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

import typer

import vitreg
from vitreg.cli.app import app
from vitreg.configs import load_config
from vitreg.core.verb import VERBS, Verb, register, reporting
from vitreg.results.schema import documents

SRC = Path(vitreg.__file__).parent
RUN_VERBS = {"diagnose", "neurons", "fix", "probe", "train", "experiment", "vlm", "export", "sae"}
OTHER_VERBS = {"compare", "validate", "report", "schema", "inspect", "models", "push"}


def test_every_command_has_one_record_and_every_record_a_command() -> None:
    assert set(VERBS) == RUN_VERBS | OTHER_VERBS
    group = typer.main.get_command(app)
    for verb in VERBS.values():
        cmd = group
        for word in verb.words:
            cmd = cmd.commands[word]  # type: ignore[attr-defined]
        assert cmd.help and verb.help.split()[0] in cmd.help, verb.name
    top = set(group.commands)  # type: ignore[attr-defined]
    assert top == {v.words[0] for v in VERBS.values()}


def test_the_schema_and_the_renderers_come_from_the_records() -> None:
    assert set(reporting()) == RUN_VERBS
    assert {name: d.model_fields["results"].annotation for name, d in documents().items()} == {
        name: v.results for name, v in reporting().items()
    }
    for verb in reporting().values():
        module = verb.render_module()
        assert callable(module.report) and callable(module.headlines), verb.name


def test_config_yaml_is_read_through_the_record(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("verb: neurons\ntop_k: 7\n")
    cfg = load_config(path, "neurons")
    assert type(cfg) is VERBS["neurons"].config and cfg.top_k == 7


def test_a_registered_verb_is_a_command_and_resumes_as_its_record_says() -> None:
    assert {n for n, v in VERBS.items() if v.resumes} == {"train", "experiment", "export"}
    before = VERBS.names()
    from pydantic import BaseModel

    class ToyConfig(BaseModel):
        verb: ClassVar[str] = "toy"

    try:
        record = register(Verb(config=ToyConfig, run=lambda *a: None, help="A toy."))
        assert VERBS["toy"] is record and record.words == ("toy",)
    finally:
        VERBS._entries.pop("toy")  # noqa: SLF001  (the test's own entry)
        VERBS._priority.pop("toy")  # noqa: SLF001
    assert VERBS.names() == before


#: how a table of verbs would name one: a config, results model or renderer module of a verb
NAMES = r"\b(DiagnoseConfig|NeuronsConfig|FixConfig|ProbeRunConfig|TrainRunConfig|ExperimentConfig|VlmConfig|DiagnoseResults|NeuronsResults|FixResults|ProbeResults|TrainResults|ExperimentResults|VlmResults)\b"


def hand_tables(root: Path) -> list[str]:
    """Lines under ``root`` that list verbs by hand: a line naming two or more verbs' configs or
    results models, or two renderer modules (imports aside), and dict items keyed by a verb
    name whose value is a renderer module, a config or a results model."""
    tables = []
    verbs = "|".join(sorted(RUN_VERBS))
    item = re.compile(
        rf'^\s*"({verbs})"\s*:\s*("vitreg\.report\.renderers\.|\w+(Config|Results)\b)'
    )
    for path in sorted(root.rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith(("from ", "import ")):
                continue
            names = set(re.findall(NAMES, line))
            found = re.findall(r"vitreg\.report\.renderers\.(\w+)\"", line)
            renderers = set(found) & RUN_VERBS
            if len(names) >= 2 or len(renderers) >= 2 or item.match(line):
                tables.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    return tables


def test_no_table_lists_the_verbs_by_hand() -> None:
    found = hand_tables(SRC)
    assert not found, "list verbs through vitreg.core.verb.VERBS:\n" + "\n".join(found)


def test_the_table_check_finds_the_shapes_of_a_hand_table(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "from vitreg.configs import FixConfig, VlmConfig\n"
        "CONFIGS = (FixConfig, VlmConfig)\n"
        "RENDERERS = {\n"
        '    "fix": "vitreg.report.renderers.fix",\n'
        '    "vlm": VlmResults,\n'
        '    "diagnose": "vitreg.analysis.diagnose",\n'
        "}\n"
    )
    assert [row.split(":")[1] for row in hand_tables(tmp_path)] == ["2", "4", "5"]
