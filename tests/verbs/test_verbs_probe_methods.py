"""``vitreg probe --fix METHOD``: a last-block method probes the model bare and fixed, side by
side, offline on planted CLIPs with synthetic data; a method list, two last-block methods and
PAMR outside ov-seg fail before any model loads, a method the model cannot take (SC-CLIP on 10
blocks) with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app
from vitreg.configs import ProbeRunConfig
from vitreg.verbs.probe import fix_plan

SPEC = "planted:clip_t16"
FAST = ["--epochs", "2", "--seeds", "2", "--batch-size", "8"]
DATA = "synthetic-seg:n=8,size=32"
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_method_runs_bare_and_fixed_and_needs_neurons_only_when_it_edits_them():
    cfg = ProbeRunConfig(spec=SPEC, fix="sc-clip")
    assert cfg.fix == "sc-clip"
    assert fix_plan(cfg.fix, cfg.neurons) == (True, None, True)
    base, neurons, fixed = fix_plan("ttr+naclip", cfg.neurons)
    assert base and fixed and neurons.kind == "discover"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--fix", "naclip,sclip"], "probe takes one fix"),
        (["--fix", "naclip+sclip"], "at most one"),
        (["--task", "segmentation", "--pamr", "10"], "PAMR"),
    ],
)
def test_bad_fix_methods_fail_before_loading(args, needle, tmp_path: Path):
    result = runner.invoke(app, ["probe", SPEC, *args, "--out", str(tmp_path / "x")])
    assert_clean_failure(result, needle)


@pytest.mark.slow  # builds the planted CLIP (~10 s)
def test_a_method_the_model_cannot_take_is_refused_with_the_reason(tmp_path: Path):
    args = ["probe", SPEC, *FAST, "--img-size", "32", "--task", "segmentation", "--data", DATA]
    args += ["--fix", "sc-clip"]
    result = runner.invoke(
        app, [*args, "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "r")]
    )
    assert_clean_failure(result, "12-block towers")


@pytest.mark.slow  # builds the planted CLIP and trains two probes per condition (~20 s)
@pytest.mark.parametrize(
    ("spec", "size", "method"),
    [(SPEC, 32, "naclip"), (SPEC, 32, "clearclip"), ("planted:clip_b16", 96, "sc-clip")],
)
def test_probe_fix_method_scores_the_planted_clip_bare_and_fixed(spec, size, method, tmp_path):
    """SC-CLIP's published indices need 12 blocks (the ViT-B/16 planted CLIP) and its LOF more
    than 30 patches (96 px)."""
    out = tmp_path / "run"
    data = f"synthetic-seg:n=8,size={size}"
    args = ["probe", spec, *FAST, "--img-size", str(size), "--task", "segmentation"]
    args += ["--data", data, "--fix", method]
    result = runner.invoke(app, [*args, "--cache", str(tmp_path / "cache"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "metrics.json").read_text())["results"]
    assert set(doc["conditions"]) == {"base", "fixed"}
    assert doc["fix"]["method"] == method
    base, fixed = (doc["conditions"][c][0]["scores"] for c in ("base", "fixed"))
    miou = [next(s["values"] for s in scores if s["metric"] == "miou") for scores in (base, fixed)]
    assert miou[0] != miou[1]  # the fix changed the final tokens the probe reads
    assert doc["deltas"]
