"""``vitreg probe`` and ``vitreg compare`` through the CLI: run directories, base and fixed
columns, merged tables, and one-paragraph errors (exit 2) for bad tasks, data and fix files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app
from vitreg.fix.neuron_set import NeuronSet

SPEC = "timm:vit_tiny_patch16_224"
DATA = "synthetic-cls:n=16,size=32"
FAST = ["--random-init", "--img-size", "32", "--epochs", "2", "--seeds", "2", "--batch-size", "8"]
runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")


def probe(tmp: Path, *args: str):
    return runner.invoke(app, ["probe", SPEC, *FAST, "--cache", str(tmp / "cache"), *args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A plain run and a ``--fix both`` run of the same model and data."""
    tmp = tmp_path_factory.mktemp("probe")
    plain = probe(tmp, "--data", DATA, "--layers", "0,-1", "--out", str(tmp / "plain"))
    assert plain.exit_code == 0, plain.output
    neurons = NeuronSet([0, 1], [5, 9], [1.0, 0.5]).save(tmp / "neurons")
    both = probe(tmp, "--data", DATA, "--fix", "both", "--neurons", str(neurons),
                 "--layers", "0,-1", "--out", str(tmp / "both"))  # fmt: skip
    assert both.exit_code == 0, both.output
    (tmp / "both.txt").write_text(both.output)
    return tmp, tmp / "plain", tmp / "both"


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def test_probe_writes_the_run_directory(runs) -> None:
    _, plain, _ = runs
    for name in ("metrics.json", "report.md", "report.html", "config.yaml"):
        assert (plain / name).is_file(), name
    doc = metrics(plain)
    results = doc["results"]
    assert results["task"] == "classification" and list(results["conditions"]) == ["base"]
    assert results["layers"] == ["blocks.0.hook_resid_post", "blocks.11.hook_resid_post"]
    assert results["seeds"] == [0, 1]
    names = [m["name"] for m in doc["metrics"]]
    assert f"classification/{DATA}/base/blocks.11.hook_resid_post/cls/all/top1" in names
    assert all(
        len(s["values"]) == 2 for layer in results["conditions"]["base"] for s in layer["scores"]
    )
    assert doc["model"]["spec"] == SPEC and doc["data"]["n_images"] == 32
    report = (plain / "report.md").read_text()
    assert (
        "| feature | tokens | metric | base |" in report
        and "fixed" not in report.split("## Data")[0]
    )


def test_fix_both_shows_base_and_fixed_columns(runs) -> None:
    _, _, both = runs
    doc = metrics(both)
    assert list(doc["results"]["conditions"]) == ["base", "fixed"]
    assert doc["results"]["fix"]["name"] == "TestTimeRegisters"
    fixed = {s["feature"] for s in doc["results"]["conditions"]["fixed"][0]["scores"]}
    assert {"test_time_registers", "test_time_registers+cls"} <= fixed
    report = (both / "report.md").read_text()
    assert "| feature | tokens | metric | base | fixed | Δ (fixed − base) |" in report
    assert "*fixed* = the same model under TestTimeRegisters" in report
    # the base condition of the second run reuses the features of the first
    assert "Features reused from the cache (no forward pass): base/train, base/test" in report
    # a one-sentence verdict in the report and the console; every console row's feature whole
    assert "**Verdict** — Best probe: " in report and "The fix (fixed − base): " in report
    console_text = (both.parent / "both.txt").read_text()
    assert "verdict: Best probe:" in " ".join(console_text.split())
    rows = [line.split("│")[2].strip() for line in console_text.splitlines() if "│ top1" in line]
    assert "test_time_registers" in rows and "test_time_registers+cls" in rows
    # two layers: one curve figure across them (a single layer gets a dot plot instead)
    assert (both / "figures" / "probe_per_layer.png").is_file()


def test_probe_scores_carry_yardsticks_and_delta_verdicts(runs) -> None:
    """Chance and majority class in metrics.json, report.md, report.html and the console; a Δ
    is labelled by whether the 95% intervals separate."""
    tmp, _, both = runs
    results = metrics(both)["results"]
    for condition in ("base", "fixed"):
        for layer in results["conditions"][condition]:
            marks = {(y["name"], y["metric"]): y["value"] for y in layer["yardsticks"]}
            assert marks[("chance", "top1")] == pytest.approx(1 / layer["info"]["num_classes"])
            assert 0 < marks[("majority class", "top1")] <= 1
            assert all(
                set(s["vs_yardsticks"]) == {"chance", "majority class"} for s in layer["scores"]
            )
    verdicts = {d["verdict"] for d in results["deltas"]}
    assert verdicts and verdicts <= {"better", "worse", "within noise"}
    report = (both / "report.md").read_text()
    assert "| yardstick | metric | tokens | value | how |" in report and "(within noise)" in report
    assert "majority class" in (both / "report.html").read_text()
    console_text = " ".join((tmp / "both.txt").read_text().split())
    assert "yardsticks at blocks.0: chance top1 0.25, majority class top1" in console_text
    assert "better/worse only when the 95% intervals separate" in console_text
    for condition in ("base", "fixed"):  # the console's count is the one metrics.json gives
        scores = [s for layer in results["conditions"][condition] for s in layer["scores"]]
        short = [s for s in scores if set(s["vs_yardsticks"].values()) != {"better"}]
        line = f"{condition}: {len(short)} of {len(scores)} scores do not clearly beat"
        assert (line in console_text) == bool(short), console_text


def test_compare_merges_runs_one_column_each(runs) -> None:
    tmp, plain, both = runs
    out = tmp / "compare"
    result = runner.invoke(app, ["compare", str(plain), str(both), "--out", str(out)])
    assert result.exit_code == 0, result.output
    merged = json.loads((out / "comparison.json").read_text())
    assert merged["runs"] == ["plain", "both"]
    rows = {r["metric"]: r["values"] for r in merged["rows"]}
    name = f"classification/{DATA}/base/blocks.0.hook_resid_post/cls/all/top1"
    values = [{m["name"]: m["value"] for m in metrics(r)["metrics"]} for r in (plain, both)]
    assert rows[name] == [values[0][name], values[1][name]]
    fixed = f"classification/{DATA}/fixed/blocks.0.hook_resid_post/test_time_registers/all/top1"
    assert rows[fixed][0] is None and rows[fixed][1] is not None  # absent from the plain run
    table = (out / "comparison.md").read_text()
    assert "| metric | plain | both |" in table


def test_errors_exit_2_with_one_paragraph(tmp_path: Path) -> None:
    assert_clean_failure(
        probe(tmp_path, "--task", "colour"),
        "--task: not a probe task",
        "token-type",
        "(got 'colour')",
    )
    assert_clean_failure(
        probe(tmp_path, "--task", "segmentation", "--data", DATA),
        "task 'segmentation' needs 'mask' targets",
        "use a dataset with masks",
    )
    missing = tmp_path / "nowhere.json"
    assert_clean_failure(
        probe(tmp_path, "--fix", str(missing), "--data", DATA),
        "neither none, both, builtin",
        "NeuronSet",
    )
    (tmp_path / "empty").mkdir()
    assert_clean_failure(probe(tmp_path, "--data", f"imagefolder:{tmp_path / 'empty'}"), "empty")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.slow
def test_the_documented_probe_demo_beats_its_yardsticks_and_says_so(tmp_path: Path) -> None:
    """The offline probe demo as docs/probe.md writes it: a score above every yardstick, base
    and fixed compared, each console row whole, and a one-sentence verdict in the console and
    the report (that the progress lines name each fit's feature: test_cli_progress)."""
    import shlex

    from conftest import ROOT

    page = (ROOT / "docs" / "probe.md").read_text()
    line = next(x for x in page.splitlines() if x.startswith("vitreg probe") and "demo" in x)
    args = shlex.split(line.split("#")[0])[1:]
    assert "hue=1" in " ".join(args) and "--fix" in args
    out = tmp_path / "demo"
    result = runner.invoke(
        app,
        [*args, "--out", str(out), "--cache", str(tmp_path / "cache")],
        env={"VITREG_PROGRESS": "plain", "COLUMNS": "100"},
    )
    assert result.exit_code == 0, result.output
    results = metrics(out)["results"]
    beaten = [
        s
        for layer in results["conditions"]["fixed"] + results["conditions"]["base"]
        for s in layer["scores"]
        if s["vs_yardsticks"] and set(s["vs_yardsticks"].values()) == {"better"}
    ]
    assert {s["feature"] for s in beaten} >= {"cls"}, results
    assert results["deltas"], "base and fixed compared"
    for feature in ("│ test_time_registers ", "│ test_time_registers+cls "):
        assert feature in result.stdout  # a whole label on a 100-column console
    text = " ".join(result.stdout.split())
    assert "verdict: Best probe:" in text and "beats every yardstick" in text
    assert "**Verdict** — Best probe:" in (out / "report.md").read_text()
    assert (out / "figures" / "probe_scores.png").is_file()  # one layer: a dot plot
