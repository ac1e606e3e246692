"""benchmarks/run_all.py on stub benchmarks: every run is a row (measured, failed, timed out or
skipped, each counted), the CSV has timm's one-row-per-benchmark-and-model shape, and --quick
reaches each script; every benchmark's --quick sizes are smaller than its defaults."""

from __future__ import annotations

import csv
import importlib
import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT

STUB = """
import json, sys
args = sys.argv[1:]
out = [a for a in args if a.startswith("--out=")][0].removeprefix("--out=")
if "--fail" in args:
    sys.exit("stub failed on purpose")
if "--hang" in args:
    import time
    time.sleep(30)
quick = "--quick" in args
ratio = 0.5 if "--slow" in args else 1.25
json.dump({
    "benchmark": "cache_speed",
    "settings": {"model": "stub_vit", "quick": quick},
    "target": 0.8,
    "throughput_ratio": ratio,
    "images_per_s": {"plain": 10.0, "cache": 10.0 * ratio},
}, open(out, "w"))
"""


@pytest.fixture
def run_all(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("run_all")


def stubs(run_all, tmp_path: Path) -> list:
    script = tmp_path / "stub.py"
    script.write_text(STUB)
    bench = run_all.Bench
    return [
        bench("fast", script),
        bench("slow", script, ("--slow",)),
        bench("broken", script, ("--fail",)),
        bench("hanging", script, ("--hang",)),
        bench("gpu only", script, needs=lambda: "no CUDA GPU on this machine"),
    ]


def test_every_benchmark_is_a_row_and_failures_are_counted(run_all, tmp_path: Path) -> None:
    table = run_all.run_all(stubs(run_all, tmp_path), True, tmp_path / "json", timeout=3)
    by = {r["benchmark"]: r for r in table}
    assert list(by) == ["fast", "slow", "broken", "hanging", "gpu only"]
    assert by["fast"]["status"] == "ok" and by["fast"]["measured"] == "1.25"
    assert by["fast"]["model"] == "stub_vit" and by["fast"]["target"] == ">= 0.8x"
    assert "plain 10 img/s" in by["fast"]["figures"]
    assert by["slow"]["status"] == "below target" and by["slow"]["meets_target"] == "false"
    assert (
        by["broken"]["status"] == "failed" and "stub failed on purpose" in by["broken"]["figures"]
    )
    assert by["hanging"]["status"] == "failed" and "timed out" in by["hanging"]["figures"]
    assert by["gpu only"]["status"] == "skipped" and "CUDA" in by["gpu only"]["figures"]
    assert {r["quick"] for r in table} == {"true"} and len({r["commit"] for r in table}) == 1
    assert all(r["cores"] and r["cpu"] and r["gpu"] and r["date"] for r in table)
    assert all(float(r["load_1m"]) >= 0 for r in table)  # the load each row was measured at
    # --quick reached the script
    assert json.loads((tmp_path / "json" / "fast.json").read_text())["settings"]["quick"]

    run_all.write_csv(table, tmp_path / "results.csv")
    run_all.write_markdown(table, tmp_path / "RESULTS.md", "results.csv")
    with (tmp_path / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["benchmark"] for r in rows] == list(by)
    assert tuple(rows[0]) == run_all.COLUMNS
    md = (tmp_path / "RESULTS.md").read_text()
    assert "Rows: 1 ok, 1 below target, 2 failed, 1 skipped." in md
    assert md.count("\n| ") == 1 + len(table)  # the header and one line per row


def test_a_result_the_table_cannot_read_is_a_failed_row(run_all, tmp_path: Path) -> None:
    script = tmp_path / "odd.py"
    script.write_text(
        "import json, sys\n"
        "out = sys.argv[-1].removeprefix('--out=')\n"
        "json.dump({'benchmark': 'cache_speed', 'settings': {}}, open(out, 'w'))\n"
    )
    (row,) = run_all.run_all([run_all.Bench("odd", script)], False, tmp_path, timeout=30)
    assert row["status"] == "failed" and "result unreadable: KeyError" in row["figures"]
    assert row["quick"] == "false"


def test_main_writes_both_files_for_the_chosen_benchmarks(run_all, tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "BENCHMARKS", tuple(stubs(run_all, tmp_path)[:2]))
    run_all.main(["--only=fast", f"--json-dir={tmp_path / 'j'}", f"--out-dir={tmp_path / 'o'}"])
    text = (tmp_path / "o" / "results.csv").read_text().splitlines()
    assert len(text) == 2 and text[1].startswith("fast,stub_vit,")
    md = (tmp_path / "o" / "RESULTS.md").read_text()
    assert "| fast | stub_vit |" in md and "load average before each benchmark" in md
    # --update reruns one benchmark and keeps the other rows, in the list's order
    run_all.main(
        ["--only=slow", "--update", f"--json-dir={tmp_path / 'j'}", f"--out-dir={tmp_path / 'o'}"]
    )
    with (tmp_path / "o" / "results.csv").open() as f:
        assert [r["benchmark"] for r in csv.DictReader(f)] == ["fast", "slow"]
    run_all.main(["--only=slow", f"--json-dir={tmp_path / 'j'}", f"--out-dir={tmp_path / 'o'}"])
    with (tmp_path / "o" / "results.csv").open() as f:
        assert [r["benchmark"] for r in csv.DictReader(f)] == ["slow"]


def test_every_script_has_a_reader_and_quick_sizes(run_all) -> None:
    """Every listed script exists, its JSON has a reader, and --quick shrinks its defaults."""
    from _rows import READERS

    for bench in run_all.BENCHMARKS:
        assert bench.script.is_file(), bench.script
        assert bench.script.stem in READERS
        assert "--quick" in bench.script.read_text() or "parse_quick" in bench.script.read_text()
    listed = {b.script.stem for b in run_all.BENCHMARKS}
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    assert scripts - listed == {"run_all", "validation"}


@pytest.mark.parametrize(
    "name",
    ["hooked_forward", "ttr_speed", "fix_speed", "stop_at_layer", "variant_speed", "cache_speed"],
)
def test_quick_sizes_are_smaller_and_an_explicit_option_wins(run_all, name: str) -> None:
    module = importlib.import_module(name)
    full, quick = module.parse([]), module.parse(["--quick"])
    assert quick.quick and not full.quick
    assert quick.batch_size < full.batch_size and quick.repeats < full.repeats
    assert module.parse(["--quick", "--batch-size=3"]).batch_size == 3


def test_rows_of_each_reader_on_a_real_shape(run_all) -> None:
    """A real plant-family summary (the shape plant_family.py writes) gives its two rows."""
    from _rows import rows_of

    summary = {
        "n_seeds": 4,
        "outcomes": {"exact": 3, "refused": 1},
        "mean_precision": 1.0,
        "mean_recall": 0.95,
        "readers_chosen": 0,
    }
    large = {"arch": "dinov2", "outcome": "exact", "causal_passes": 93, "seconds": 2.5}
    result = {
        "benchmark": "plant_family",
        "settings": {"backbone": "random"},
        "summary": summary,
        "large": large,
    }
    family, big = rows_of(result)
    assert family.measured == 0.75 and family.status == "below target"
    assert "exact 3, refused 1" in family.figures
    assert big.status == "ok" and "93 causal passes" in big.figures
    assert sys.modules["_rows"].num(None) == "n/a"
