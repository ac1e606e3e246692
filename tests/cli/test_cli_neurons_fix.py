"""``vitreg neurons`` and ``vitreg fix``: run directories, numbers equal to the library's, export,
and clear errors for sets that do not fit the model."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import vitreg
from _support.cli_helpers import assert_clean_failure, flat
from vitreg.cli.app import app
from vitreg.data.images import synthetic_source
from vitreg.fix import TestTimeRegisters, compare_fix
from vitreg.neurons import NeuronSet, builtin_neurons
from vitreg.neurons.auto import SPLIT_RULE, find_neurons
from vitreg.testing import synthetic_pil
from vitreg.testing.planted import build_unplanted
from vitreg.verbs import loading

SPEC = "planted:dinov2_s14"
SIZE = ["--img-size", "112"]
SMALL = [*SIZE, "--limit", "8", "--batch-size", "4"]
FEW = [*SIZE, "--limit", "4", "--batch-size", "4"]
runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def cached_models(cli_models: dict) -> dict:
    """Every test here builds each model once."""
    return cli_models


def model(cached_models: dict):
    return cached_models[SPEC]


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def the_images(m, n: int = 8) -> torch.Tensor:
    """The first ``n`` synthetic images (the commands' default source for planted models)."""
    return torch.cat(list(synthetic_source(m, n=n, batch_size=8)))


@pytest.fixture(scope="module")
def neurons_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    run_dir = tmp_path_factory.mktemp("neurons") / "run"
    args = ["neurons", *SMALL, "--check-sizes", "140", "--out", str(run_dir)]
    return run_dir, runner.invoke(app, args)


@pytest.fixture(scope="module")
def fix_run(tmp_path_factory: pytest.TempPathFactory, neurons_run) -> tuple[Path, Path, object]:
    root = tmp_path_factory.mktemp("fix")
    run_dir, saved = root / "run", root / "saved"
    args = ["fix", "--neurons", str(neurons_run[0] / "neurons.json"), *FEW]
    result = runner.invoke(app, [*args, "--out", str(run_dir), "--save", str(saved)])
    return run_dir, saved, result


def test_neurons_writes_the_set_and_a_report_equal_to_the_library(neurons_run, cached_models):
    run_dir, result = neurons_run
    assert result.exit_code == 0, result.output
    out = flat(result.stdout)
    assert "embedded demo" in out and "synthetic" in out and "6 images for discovery" in out
    for name in ("neurons.json", "neurons.safetensors", "report.md", "report.html", "metrics.json"):
        assert (run_dir / name).is_file(), name
    figures = {p.name for p in (run_dir / "figures").glob("*.png")}
    assert figures == {"neuron_scores.png", "calibration_curve.png"}
    assert "SYNTHETIC" in (run_dir / "report.md").read_text().splitlines()[0]
    m = metrics(run_dir)
    r = m["results"]
    saved = NeuronSet.load(run_dir / "neurons.json")
    # the library's automatic path on the same images gives the same numbers
    found = find_neurons(model(cached_models), the_images(model(cached_models)), batch_size=4)
    assert saved.pairs() == found.chosen.pairs() == [(n["layer"], n["unit"]) for n in r["neurons"]]
    assert r["chosen_k"] == found.chosen_k == len(saved) > 0
    assert [(n["layer"], n["unit"]) for n in r["ranking"]] == found.ranked.pairs()
    assert r["detect_layer"] == found.detection.detect_layer == saved.settings["detect_layer"]
    assert r["threshold_value"] == pytest.approx(found.detection.threshold_value, rel=1e-5)
    assert r["held_out"]["n_images"] == 2 and m["data"]["split"]["n_discovery"] == 6
    for key in ("outlier_rate_before", "outlier_rate_after", "max_over_median_after"):
        assert r["held_out"][key] == pytest.approx(getattr(found.held_out, key))
    # judged by what the fix leaves: no outlier mode at any block on the held-out images
    assert r["status"] == "clean" and r["held_out"]["blocks_with_outlier_mode_after"] == []
    assert r["held_out"]["blocks_with_outlier_mode_before"]
    assert found.calibration is not None and r["calibration"]["ks"] == found.calibration.ks
    truth = model(cached_models).module.vitreg_planted
    causes = {u for u in truth.units if u[0] == truth.first_outlier_layer}
    assert set(saved.pairs()) == causes  # the units that write the outliers, no reader
    assert all(n["effect_in_set"] > 0.01 for n in r["neurons"])
    assert (
        r["emergence_layer"] == truth.first_outlier_layer <= r["highest_layer"] <= r["detect_layer"]
    )
    assert "first appear at the output of block" in r["reasons"]["highest_layer"]
    headline = {h["name"]: h["value"] for h in m["metrics"]}
    assert headline["n_neurons"] == len(saved) and headline["detect_layer"] == r["detect_layer"]
    assert {x["layer"] for x in r["layers"]} == set(saved.by_layer())
    # --check-sizes: the set found at 112 px checked at 140 px, said in metrics, report, console
    (row,) = r["other_sizes"]["sizes"]
    assert row["img_size"] == 140 and row["clean_after"] and r["other_sizes"]["clean_at_every_size"]
    assert (
        "Other sizes (the held-out images resized): 140 px clean"
        in (run_dir / "report.md").read_text()
    )
    assert "│ other sizes │ 140 px: clean │" in out and "the model now takes other sizes" in out


def test_fix_records_a_command_that_fix_accepts(fix_run) -> None:
    run_dir, _, result = fix_run
    command = json.loads((run_dir / "metrics.json").read_text())["command"]
    options = {t for t in shlex.split(command) if t.startswith("--")}
    accepted = set(
        re.findall(r"--[a-z][a-z-]+", flat(runner.invoke(app, ["fix", "--help"]).output))
    )
    assert options and options <= accepted, options - accepted  # no --top-k auto, say
    assert "--neurons" in options and "--top-k" not in options


def test_fix_reports_before_and_after_equal_to_compare_fix(fix_run, neurons_run, cached_models):
    run_dir, _, result = fix_run
    assert result.exit_code == 0, result.output
    figures = {p.name for p in (run_dir / "figures").glob("*.png")}
    assert figures == {
        "fix_norm_maps.png",
        "fix_attention_maps.png",
        "fix_norm_curves.png",
        "fix_feature_pictures.png",
    }
    report = (run_dir / "report.md").read_text()
    assert "SYNTHETIC" in report.splitlines()[0] and "Global information is kept" in report
    assert "Causal controls" in report and "as many random neurons zeroed" in report
    assert "outlier moved to patch 0" in report
    page = (run_dir / "report.html").read_text()
    assert (
        "data:image/webp;base64," in page
        and "Causal controls" in page
        and "http" not in page.split("<body")[0]
    )
    c = metrics(run_dir)["results"]["comparison"]
    assert c["outlier_rate_before"] > 0.01 >= c["outlier_rate_after"]  # the planted default
    m = model(cached_models)
    neurons = NeuronSet.load(neurons_run[0] / "neurons.json")
    lib = compare_fix(m, TestTimeRegisters(neurons), the_images(m, 4), batch_size=4).results
    lib = lib.model_dump(mode="json")
    assert c["fix"] == lib["fix"] and c["detect_layer"] == lib["detect_layer"]
    for key in ("outlier_rate_before", "outlier_rate_after"):
        assert c[key] == pytest.approx(lib[key]), key
    assert c["pooled_cosine"]["mean"] == pytest.approx(lib["pooled_cosine"]["mean"], rel=1e-5)
    assert c["register_norm_after"] == pytest.approx(lib["register_norm_after"], rel=1e-5)
    layer = c["detect_layer"]
    assert c["register_norm_after"][layer] > c["max_patch_norm_after"][layer]
    headline = {h["name"]: h["value"] for h in metrics(run_dir)["metrics"]}
    assert headline["outlier_rate_after"] == c["outlier_rate_after"]
    assert headline["pooled_cosine_mean"] == c["pooled_cosine"]["mean"]
    assert metrics(run_dir)["results"]["neurons"]["fingerprint_matches"] is True
    # the verdict at every block comes first, judged by the presence test, not the threshold
    res = c["residual"]
    assert res["clean"] and res["blocks_with_mode_after"] == [] and res["blocks_with_mode_before"]
    assert report.index("## Verdict after the fix") < report.index("## Before and after")
    assert "**No artifacts after the fix**" in report
    assert headline["clean_after"] is True
    assert "no artifacts after the fix" in flat(result.stdout)
    # the demo's planted units are all shown, helpers too, causes chosen and readers not
    rows = metrics(run_dir)["results"]["planted"]
    truth = m.module.vitreg_planted
    helpers = {(layer, unit) for layer, unit, _ in truth.helper_units}
    assert helpers and {(r["layer"], r["unit"]) for r in rows} == set(truth.units) | helpers
    assert all(r["role"].startswith("helper") for r in rows if (r["layer"], r["unit"]) in helpers)
    assert {(r["layer"], r["unit"]) for r in rows if r["chosen"]} == set(truth.causal_units)
    assert "Planted ground truth" in report


def test_saved_fixed_model_loads_and_behaves_like_the_fixed_model(fix_run, cached_models):
    _, saved, result = fix_run
    assert result.exit_code == 0, result.output
    m = model(cached_models)
    x = the_images(m, 4)[:3]
    neurons = NeuronSet.load(saved / "neurons.json")
    with TestTimeRegisters(neurons).applied(m):
        fixed = m.features(x)
    bare = m.features(x)
    spec = f"local:{saved}"
    again = runner.invoke(app, ["fix", spec, "--neurons", str(saved / "neurons.json"), *FEW])
    assert_clean_failure(again, "already applied")  # no second fix on top of the saved one
    loaded = cached_models[spec]  # what vitreg.load(spec, img_size=112) gave
    assert loaded.layout.n_extra == 1
    assert torch.allclose(loaded.features(x), fixed, atol=1e-5)
    assert not torch.allclose(bare, fixed, atol=1e-3)  # the fix changes the features


def test_a_set_for_another_architecture_names_both_models(tmp_path: Path) -> None:
    other = builtin_neurons("timm:vit_large_patch14_dinov2.lvd142m")
    path = other.save(tmp_path / "large")
    args = [
        "fix",
        SPEC,
        "--neurons",
        str(path),
        *SIZE,
        "--limit",
        "4",
        "--out",
        str(tmp_path / "r"),
    ]
    result = runner.invoke(app, args)
    assert_clean_failure(result, "timm:vit_large_patch14_dinov2.lvd142m", SPEC)
    assert not (tmp_path / "r" / "metrics.json").exists()
    builtin = runner.invoke(app, ["fix", SPEC, "--neurons", "builtin", *SIZE, "--limit", "4"])
    assert_clean_failure(builtin, "no built-in neuron set", SPEC)


def test_out_of_range_units_exit_2(tmp_path: Path) -> None:
    path = NeuronSet([3], [99999], [1.0]).save(tmp_path / "bad")
    result = runner.invoke(app, ["fix", SPEC, "--neurons", str(path), *SIZE, "--limit", "4"])
    assert_clean_failure(result, "outside the model", SPEC, "99999")


def test_a_model_without_outliers_is_a_discovery_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = vitreg.wrap(build_unplanted("dinov2_s14", img_size=112), spec="unplanted:dinov2_s14")
    monkeypatch.setattr(loading, "load_spec", lambda *a: clean)
    out, folder = tmp_path / "r", tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(synthetic_pil(8, size=112, seed=1)):  # not the 6 sample photos
        image.save(folder / f"{i}.png")
    result = runner.invoke(
        app, ["neurons", SPEC, *SMALL, "--images", str(folder), "--out", str(out)]
    )
    assert_clean_failure(result, "no high-norm outliers")
    assert not out.exists()


def test_bad_options_exit_2_before_any_work(tmp_path: Path) -> None:
    cases = [
        (["neurons", "--top-k", "many"], "--top-k"),
        (["neurons", "--threshold", "median"], "--threshold"),
        (["neurons", "--images", str(tmp_path), "--samples"], "exclude"),
        (["fix", "--cls", "drop"], "--cls"),
        (["fix", "--mode", "official"], "--mode"),
    ]
    for args, needle in cases:
        assert_clean_failure(runner.invoke(app, args), needle)


def test_a_top_k_beyond_the_candidates_exits_2_naming_their_number(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = runner.invoke(app, ["neurons", *SMALL, "--top-k", "100000", "--out", str(out)])
    assert_clean_failure(result, "--top-k 100000", "12288 MLP units", "--top-k 12288 or fewer")
    assert not (out / "metrics.json").exists()


@pytest.mark.parametrize("limit", ["3", "7"])
def test_too_few_images_to_hold_out_enough(tmp_path: Path, limit: str) -> None:
    result = runner.invoke(app, ["neurons", *SIZE, "--limit", limit, "--out", str(tmp_path / "r")])
    assert_clean_failure(result, "at least 8 images", f"got {limit}")


def test_fix_without_neurons_discovers_first_and_fixed_top_k(tmp_path: Path) -> None:
    run_dir = tmp_path / "fix"
    result = runner.invoke(app, ["fix", *SMALL, "--out", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "discovering register neurons" in flat(result.stdout)
    r = metrics(run_dir)["results"]
    assert r["comparison"]["outlier_rate_after"] <= 0.01
    assert r["discovery"]["chosen_k"] == r["neurons"]["n_neurons"] > 0
    fixed = tmp_path / "k5"
    result = runner.invoke(app, ["neurons", *SMALL, "--top-k", "5", "--out", str(fixed)])
    assert result.exit_code == 0, result.output
    r = metrics(fixed)["results"]
    assert r["top_k_mode"] == "fixed" and r["n_neurons"] == 5 and r["calibration"] is None
    assert r["held_out"]["outlier_rate_after"] <= 0.01
    assert not (fixed / "figures" / "calibration_curve.png").exists()


def test_neurons_on_an_image_folder_lists_the_split_and_skipped_files(tmp_path: Path) -> None:
    from vitreg.testing.images import synthetic_pil

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, img in enumerate(synthetic_pil(8, 112, seed=0, flat_fraction=0.1)):
        img.save(folder / f"{i:02d}.png")
    (folder / "notes.txt").write_text("not an image\n")
    run_dir = tmp_path / "run"
    args = ["neurons", SPEC, "--images", str(folder), *SIZE, "--out", str(run_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    m = metrics(run_dir)
    assert m["data"]["source"] == "folder" and m["data"]["n_images"] == 8
    assert [Path(k).name for k in m["data"]["skipped"]] == ["notes.txt"]
    assert m["data"]["split"] == {
        "rule": SPLIT_RULE,
        "n_discovery": 6,
        "n_held_out": 2,
    }
    saved = NeuronSet.load(run_dir / "neurons.json")
    assert saved.data["split"]["n_held_out"] == 2 and str(folder) in saved.data["images"]
    assert "notes.txt" in (run_dir / "report.md").read_text()


def test_fix_options_reach_the_fix_and_the_report(tmp_path: Path, neurons_run) -> None:
    run_dir = tmp_path / "run"
    other = NeuronSet.load(neurons_run[0] / "neurons.json")
    other.fingerprint = "0" * 16  # same architecture, other weights
    args = ["fix", SPEC, "--neurons", str(other.save(tmp_path / "other")), *FEW]
    args += ["--registers", "2", "--cls", "keep", "--patches", "mean", "--out", str(run_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    m = metrics(run_dir)
    fix = m["results"]["comparison"]["fix"]
    assert (fix["n_registers"], fix["cls"], fix["patches"], fix["mode"]) == (
        2,
        "keep",
        "mean",
        "paper",
    )
    assert m["config"]["registers"] == 2 and m["results"]["saved"] is None
    assert "other weights" in flat(result.stdout)
    assert m["results"]["neurons"]["fingerprint_matches"] is False
    report = (run_dir / "report.md").read_text()
    assert "| registers | 2 |" in report and "| patches | mean |" in report
