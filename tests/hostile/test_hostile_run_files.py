"""Forged or damaged files that vitreg reads back -- a run's metrics.json, a comparison folder,
a ``--config`` YAML -- are a named error (``validate``: "invalid" with the file and the field;
``compare``: a counted skip; ``--config``: exit 2, one bounded paragraph), never a traceback, a
hang or a message that prints the whole input. And every folder vitreg writes is read back:
``validate`` and ``compare`` accept ``diagnose --models`` and ``compare --out`` folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure, flat
from vitreg.cli.app import app
from vitreg.core.readers import read_json, read_yaml
from vitreg.errors import InputError
from vitreg.report.compare import compare_runs
from vitreg.report.document import Headline, build_document
from vitreg.results.schema import ModelDescription, data_info, model_info

runner = CliRunner()
COMPANIONS = ("config.yaml", "report.md", "report.html")


def train_doc() -> dict:
    """A valid metrics.json of a (tiny, made-up) train run."""
    described = {"spec": "vit_tiny_patch16_224", "family": "vit", "layout": {}}
    results = {
        "recipe": "supervised",
        "steps": 2,
        "final_loss": 0.5,
        "loss_first": 1.0,
        "resumed_from": None,
        "weights": None,
        "log": "train_log.jsonl",
        "train_config": {
            "recipe": "supervised",
            "steps": 2,
            "batch_size": 2,
            "lr": 1e-3,
            "min_lr": 1e-6,
            "weight_decay": 0.05,
            "warmup_steps": 0,
            "clip_grad": None,
            "accum_steps": 1,
            "amp": "none",
            "seed": 0,
            "img_size": 32,
            "checkpoint_every": 2,
            "keep_checkpoints": 1,
            "model": {"name": "vit_tiny_patch16_224"},
            "options": {"label_smoothing": 0.0, "jitter": 0.3},
            "data": {"spec": "imagefolder:tiny", "n": 2, "fingerprint": None},
        },
    }
    headlines = [Headline("final_loss", "/results/final_loss", False)]
    doc = build_document("train", results, headlines, command="vitreg train",
                         described=model_info(ModelDescription.model_validate(described)), data=data_info({"n_images": 8}),
                         config={})  # fmt: skip
    return doc.model_dump(mode="json")


def write_run(folder: Path, doc: object | bytes) -> Path:
    folder.mkdir(parents=True)
    for name in COMPANIONS:
        (folder / name).write_text("x")
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    (folder / "metrics.json").write_bytes(raw)
    return folder


def forged(case: str) -> object | bytes:
    good = train_doc()
    metric = good["metrics"][0]
    return {
        "missing_name": {"metrics": [{"value": 1}]},
        "metrics_int": {**good, "metrics": 5},
        "metric_int": {**good, "metrics": [5]},
        "value_object": {**good, "metrics": [{**metric, "value": {"a": 1}}]},
        "model_int": {**good, "model": 5},
        "results_list": {**good, "results": [1, 2]},
        "deep_list": b"[" * 100_000 + b"]" * 100_000,
        "deep_metric": {**good, "metrics": [{**metric, "value": [[[[[[1]]]]]]}]},
        "not_utf8": b'{"metrics": ["\xff\xfe"]}',
        "source_out_of_range": {**good, "metrics": [{**metric, "source": "/results/steps/9"}]},
        "source_missing_key": {**good, "metrics": [{**metric, "source": "/results/nope/0"}]},
        "source_into_list": {**good, "metrics": [{**metric, "source": "/metrics/x"}]},
        "huge_number": b'{"metrics": [{"name": "a", "value": ' + b"9" * 5000 + b"}]}",
        "a_list": [1, 2, 3],
    }[case]


CASES = {
    "missing_name": "metrics[0].name is null",
    "metrics_int": "has no metrics list",
    "metric_int": "metrics[0] is an int (5)",
    "value_object": "metrics[0].value is a dict",
    "model_int": "model is an int (5)",
    "results_list": "results is a list",
    "deep_list": "nests more than 64 levels",
    "deep_metric": "metrics[0].value is a list",
    "not_utf8": "not UTF-8",
    "source_out_of_range": "pointer '/results/steps/9' does not resolve",
    "source_missing_key": "pointer '/results/nope/0' does not resolve",
    "source_into_list": "pointer '/metrics/x' does not resolve",
    "huge_number": "not valid JSON",
    "a_list": "not a result document",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forged_metrics_are_invalid_in_validate_and_skipped_in_compare(
    tmp_path: Path, case: str
) -> None:
    good = write_run(tmp_path / "good", train_doc())
    bad = write_run(tmp_path / "bad", forged(case))
    result = runner.invoke(app, ["validate", str(bad), str(good)])
    assert result.exit_code == 2 and "bug" not in result.output, result.output
    text = flat(result.stdout)
    assert f"invalid {bad}:" in text and CASES[case] in text, text
    assert f"valid {good}: train run" in text and len(text) < 2000
    merged = compare_runs([bad, good])
    if case.startswith("source_"):  # shaped like a run: compared, its pointer never followed
        assert len(merged.runs) == 2
    else:
        assert list(merged.skipped) == [str(bad)] and CASES[case] in merged.skipped[str(bad)]
        cli = runner.invoke(app, ["compare", str(bad), str(good)])
        assert cli.exit_code == 0 and "skipped" in cli.stdout, cli.output


def test_the_json_reader_bounds_size_and_depth(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("[" * 70 + "]" * 70)
    with pytest.raises(InputError, match="nests more than 64 levels"):
        read_json(path, "run file")
    path.write_text("[" * 60 + "]" * 60)
    value, depth = read_json(path, "run file"), 1  # 60 levels read fine
    while value:
        value, depth = value[0], depth + 1
    assert depth == 60
    path.write_text(json.dumps(list(range(100))))
    with pytest.raises(InputError, match="at most 0 MiB"):
        read_json(path, "run file", max_bytes=10)


def fake_probe(folder: Path, task: str, n: int, mean: float) -> Path:
    """A probe run written before metric names carried the task and data (schema 1.1)."""
    data = {"train": {"spec": f"synthetic-cls:n={n}"}, "test": {"spec": f"synthetic-cls:n={n}"}}
    doc = {
        "verb": "probe",
        "command": f"vitreg probe --task {task}",
        "model": {"spec": "planted:dinov2_s14"},
        "results": {"task": task, "data": data},
        "metrics": [{"name": "base/l/cls/all/top1", "value": mean, "higher_is_better": True}],
    }
    return write_run(folder, doc)


def test_scores_of_other_tasks_or_data_never_share_a_row(tmp_path: Path) -> None:
    from vitreg.report.renderers.probe import headlines
    from vitreg.results.probe import ProbeResults

    cls = fake_probe(tmp_path / "cls", "classification", 200, 0.9)
    tokens = fake_probe(tmp_path / "tokens", "token-type", 64, 0.4)
    again = fake_probe(tmp_path / "again", "classification", 200, 0.8)
    rows = compare_runs([cls, tokens, again]).rows
    assert [r.metric for r in rows] == [
        "classification/synthetic-cls:n=200/base/l/cls/all/top1",
        "token-type/synthetic-cls:n=64/base/l/cls/all/top1",
    ]
    assert rows[0].values == [0.9, None, 0.8] and rows[1].values == [None, 0.4, None]
    # the names probe writes now carry the task and the data themselves
    results = json.loads((cls / "metrics.json").read_text())["results"]
    score = {"feature": "cls", "group": "all", "metric": "top1", "mean": 0.9, "ci95": None,
             "values": [0.9], "higher_is_better": True, "n_test": 8, "lrs": [0.1]}  # fmt: skip
    layer = {"task": "classification", "layer": "l", "scores": [score], "notes": [], "info": {},
             "yardsticks": []}  # fmt: skip
    results |= {"seeds": [0], "layers": ["l"], "conditions": {"base": [layer]}}
    typed = ProbeResults.model_validate(results)  # headlines read the typed results
    assert headlines(typed)[0].name == "classification/synthetic-cls:n=200/base/l/cls/all/top1"


def comparison_folder(tmp_path: Path) -> Path:
    """A ``diagnose --models``-shaped folder: comparison.json, its files, two model runs."""
    folder = tmp_path / "models"
    for name in ("a", "b"):
        write_run(folder / name, train_doc())
    for name in ("config.yaml", "comparison.md", "report.html"):
        (folder / name).write_text("x")
    runs = [{"model": f"planted:{n}", "run_dir": n} for n in ("a", "b")]
    (folder / "comparison.json").write_text(
        json.dumps({"verb": "diagnose", "runs": runs, "rows": [{"model": "planted:a"}]})
    )
    return folder


def test_comparison_folders_are_validated_and_compared(tmp_path: Path) -> None:
    folder = comparison_folder(tmp_path)
    ok = runner.invoke(app, ["validate", str(folder)])
    assert ok.exit_code == 0 and "diagnose --models comparison of 2 valid" in flat(ok.stdout)
    out = tmp_path / "cmp"
    compared = runner.invoke(app, ["compare", str(folder), "--out", str(out)])
    assert compared.exit_code == 0, compared.output
    merged = json.loads((out / "comparison.json").read_text())
    assert merged["runs"] == ["a", "b"] and merged["skipped"] == {}
    assert merged["vitreg_version"] and merged["command"].startswith("vitreg compare")
    assert "## Provenance" in (out / "comparison.md").read_text()
    again = runner.invoke(app, ["validate", str(out)])
    assert again.exit_code == 0 and "compare output, 2 runs" in flat(again.stdout)
    twice = runner.invoke(app, ["compare", str(out), str(folder / "a")])  # the same runs
    assert twice.exit_code == 0 and json.loads((out / "comparison.json").read_text())["runs"] == [
        "a",
        "b",
    ]
    # a forged comparison names the field; a broken model run names the run
    (folder / "b" / "metrics.json").write_text("{")
    broken = runner.invoke(app, ["validate", str(folder)])
    assert broken.exit_code == 2 and "1 of its 2 model runs are invalid: b:" in flat(broken.stdout)
    (folder / "comparison.json").write_text(json.dumps({"verb": "diagnose", "runs": [{"run_dir": "../x"}], "rows": []}))  # fmt: skip
    forged_dir = runner.invoke(app, ["validate", str(folder)])
    assert "runs[0].run_dir is a str ('../x')" in flat(forged_dir.stdout)
    assert str(folder) in compare_runs([folder, folder / "a"]).skipped


# -- --config YAML: one reader with size, depth and alias budgets --------------------------------


def alias_bomb() -> str:
    """The "billion laughs": 9 levels of 9 aliases, 600 bytes that expand to 9^9 strings."""
    text, previous = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n', "a"
    for name in "bcdefghi":
        text += f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]\n"
        previous = name
    return text + f"spec: *{previous}\n"


YAML_CASES = {
    "alias_bomb": ("diagnose", alias_bomb(), "holds more than 100,000 values"),
    "many_aliases": (
        "diagnose",
        "a: &a 1\nb: [" + ",".join(["*a"] * 200) + "]\n",
        "more than 100 aliases",
    ),
    "deep": ("diagnose", "spec: " + "[" * 5000 + "]" * 5000 + "\n", "nests more than 64"),
    "bigint": ("train", "variant: x\ndata: y\nsteps: " + "9" * 5000 + "\n", "cannot read"),
    "seed": (
        "train",
        "variant: vit_tiny_patch16_224\ndata: synthetic-cls:n=8\nsteps: 1\nseed: " + "9" * 30,
        "seed: Input should be less than or equal to 4294967295",
    ),
    "img_size": ("probe", "img_size: 100000\n", "img_size: the input size must be a whole number of pixels from 1 to 4096"),
    "huge_list": ("diagnose", "spec: [" + ",".join(["x" * 50] * 2000) + "]\n", "(got a list of 2000 items)"),
    "not_utf8": ("diagnose", b"spec: \xff\xfe\n", "not UTF-8"),
    "too_large": ("diagnose", "# " + "x" * 2**20 + "\n", "MiB"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(YAML_CASES))
def test_hostile_config_yaml_is_one_bounded_paragraph(tmp_path: Path, case: str) -> None:
    verb, body, needle = YAML_CASES[case]
    path = tmp_path / "config.yaml"
    raw = body if isinstance(body, bytes) else body.encode()
    path.write_bytes(f"verb: {verb}\n".encode() + raw)
    result = runner.invoke(app, [verb, "--config", str(path), "--out", str(tmp_path / "run")])
    message = assert_clean_failure(result, "--config", needle)
    assert len(message) < 600, message
    assert not (tmp_path / "run").exists()


def test_many_wrong_fields_are_counted_not_listed(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("verb: diagnose\n" + "".join(f"k{i}: {'v' * 500}\n" for i in range(50)))
    message = assert_clean_failure(runner.invoke(app, ["diagnose", "--config", str(path)]), "k0")
    assert "and 42 more fields" in message and len(message) < 1500


def test_a_few_aliases_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: &a [1, 2]\nb: *a\n")
    assert read_yaml(path, "config") == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(InputError, match="more than 0 aliases"):
        read_yaml(path, "config", max_aliases=0)
