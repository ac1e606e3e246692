"""``vitreg diagnose``: run directories, bad image folders, comparisons, interruptions, benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure, flat
from conftest import HANG_GUARD_S, ROOT
from vitreg.cli.app import app
from vitreg.testing.images import synthetic_pil
from vitreg.verbs import loading

SIZE = ["--img-size", "112"]
runner = CliRunner()
_BUILT: dict[tuple, object] = {}


@pytest.fixture(autouse=True)
def reuse_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build each planted model once per session (diagnose leaves no hook behind)."""
    real = loading.load_spec

    def cached(spec, pretrained, weights, img_size):
        key = (spec, pretrained, weights, img_size)
        if key not in _BUILT:
            _BUILT[key] = real(spec, pretrained, weights, img_size)
        return _BUILT[key]

    monkeypatch.setattr(loading, "load_spec", cached)


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def data_block(m: dict) -> dict:
    return m["data"]


@pytest.mark.slow
def test_default_run_writes_the_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["diagnose", *SIZE, "--limit", "6", "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    out = flat(result.stdout)
    assert "embedded demo" in out and "synthetic" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("_planted-dinov2_s14_diagnose")
    assert f"run directory (planted:dinov2_s14): {run_dir.relative_to(tmp_path)}" in out
    for name in ("config.yaml", "report.md", "report.html", "metrics.json"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "figures").glob("*.png"))
    assert "SYNTHETIC" in (run_dir / "report.md").read_text().splitlines()[0]
    m = metrics(run_dir)
    data = data_block(m)
    assert data["source"] == "synthetic" and data["synthetic"] is True
    assert data["n_images"] == 6 and data["skipped"] == {}
    assert "artifacts" in out and "block 6" in out  # planted: outliers from block 6


def bad_folder(root: Path) -> Path:
    """Two good photos plus a corrupt PNG, grayscale, RGBA and 16-bit PNGs and a text file."""
    folder = root / "imgs"
    folder.mkdir()
    good = synthetic_pil(5, 112, seed=3, flat_fraction=0.1)
    good[0].save(folder / "a_good.png")
    good[1].save(folder / "b_good.jpg")
    good[2].convert("L").save(folder / "c_gray.png")
    good[3].convert("RGBA").save(folder / "d_rgba.png")
    deep = (np.asarray(good[4].convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
    Image.fromarray(deep).save(folder / "e_16bit.png")
    assert Image.open(folder / "e_16bit.png").mode.startswith("I")
    blob = (folder / "a_good.png").read_bytes()
    (folder / "f_corrupt.png").write_bytes(blob[: len(blob) // 3])
    (folder / "g_notes.txt").write_text("not an image\n")
    return folder


def test_bad_image_folder_completes_and_lists_files(tmp_path: Path) -> None:
    folder = bad_folder(tmp_path)
    run_dir = tmp_path / "run"
    args = ["diagnose", "planted:dinov2_s14", *SIZE, "--images", str(folder), "--max-maps", "2"]
    args += ["--out", str(run_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "5 (3 converted, 2 skipped)" in flat(result.stdout)
    data = data_block(metrics(run_dir))
    assert data["source"] == "folder" and data["n_images"] == 5
    skipped = {Path(k).name: v for k, v in data["skipped"].items()}
    assert set(skipped) == {"f_corrupt.png", "g_notes.txt"}
    assert "decoded" in skipped["f_corrupt.png"] and "not an image" in skipped["g_notes.txt"]
    converted = {Path(k).name: v for k, v in data["converted"].items()}
    assert converted["c_gray.png"] == "L" and converted["d_rgba.png"] == "RGBA"
    assert converted["e_16bit.png"].startswith("I")
    report = (run_dir / "report.md").read_text()
    for name in (*skipped, *converted):
        assert name in report, name


def test_empty_or_unreadable_folder_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "run"
    base = ["diagnose", "planted:dinov2_s14", *SIZE, "--out", str(out), "--images"]
    assert_clean_failure(runner.invoke(app, [*base, str(empty)]), "is empty")
    assert_clean_failure(runner.invoke(app, [*base, str(tmp_path / "nope")]), "does not exist")
    (empty / "notes.txt").write_text("no images here")
    assert_clean_failure(runner.invoke(app, [*base, str(empty)]), "no readable image")
    assert not (out / "metrics.json").exists()


def test_option_conflicts_exit_2(tmp_path: Path) -> None:
    both = ["diagnose", "--images", str(tmp_path), "--samples"]
    assert_clean_failure(runner.invoke(app, both), "exclude")
    spec_and_models = ["diagnose", "planted:dinov2_s14", "--models", "planted:deit3_s16"]
    assert_clean_failure(runner.invoke(app, spec_and_models), "not both")
    assert_clean_failure(runner.invoke(app, ["diagnose", "nosuch:model"]), "unknown model source")


REAL = ["timm:vit_small_patch16_224", "--random-init", "--img-size", "64"]


def test_real_model_defaults_to_sample_photos(tmp_path: Path) -> None:
    pytest.importorskip("skimage")
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["diagnose", *REAL, "--limit", "2", "--out", str(run_dir)])
    assert result.exit_code == 0, result.output
    data = data_block(metrics(run_dir))
    assert data["source"] == "samples" and data["synthetic"] is False
    assert data["n_images"] == 2 and data["names"] == ["astronaut", "coffee"]


def test_real_model_without_images_or_samples_says_what_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vitreg.data import samples
    from vitreg.errors import VitregError

    def no_skimage(names=None):
        raise VitregError("sample photos come from scikit-image, which is not installed")

    monkeypatch.setattr(samples, "sample_images", no_skimage)
    result = runner.invoke(app, ["diagnose", *REAL, "--out", str(tmp_path / "run")])
    assert_clean_failure(result, "--images DIR", "--samples", "scikit-image")


@pytest.mark.slow
def test_models_writes_sub_runs_and_comparison(tmp_path: Path) -> None:
    run_dir = tmp_path / "cmp"
    specs = "planted:dinov2_s14,planted:deit3_s16"
    args = ["diagnose", "--models", specs, *SIZE, "--limit", "4", "--out", str(run_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    subs = {"planted-dinov2_s14", "planted-deit3_s16"}
    assert subs <= {p.name for p in run_dir.iterdir()}
    for sub in subs:
        assert data_block(metrics(run_dir / sub))["n_images"] == 4
    comparison = json.loads((run_dir / "comparison.json").read_text())
    assert [r["run_dir"] for r in comparison["runs"]] == ["planted-dinov2_s14", "planted-deit3_s16"]
    assert len(comparison["rows"]) == 2
    md = (run_dir / "comparison.md").read_text()
    assert "planted:deit3_s16" in md and "planted-deit3_s16/report.md" in md
    assert "planted:deit3_s16" in result.stdout
    shown = "".join(result.stdout.split())  # both files named, each path whole
    assert f"comparison:{run_dir / 'comparison.md'}and{run_dir / 'report.html'}" in shown
    # a folder like every other run: banner first, provenance, config.yaml that reruns it
    assert md.startswith("**SYNTHETIC MODEL:** `planted:dinov2_s14`") and "## Provenance" in md
    assert (
        comparison["command"].startswith("vitreg diagnose --limit 4")
        and specs in comparison["command"]
    )
    assert comparison["vitreg_version"] and comparison["config"]["models"] == specs
    validated = runner.invoke(app, ["validate", str(run_dir)])
    assert validated.exit_code == 0 and "comparison of 2 valid model runs" in flat(validated.stdout)
    compared = runner.invoke(app, ["compare", str(run_dir)])
    assert compared.exit_code == 0 and "skipped" not in compared.stdout, compared.output
    again = runner.invoke(
        app,
        ["diagnose", "--config", str(run_dir / "config.yaml"), "--out", str(tmp_path / "again")],
    )
    assert again.exit_code == 0, again.output
    rerun = json.loads((tmp_path / "again" / "comparison.json").read_text())
    assert rerun["rows"] == comparison["rows"]


def test_interrupted_run_leaves_no_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitreg.data import images

    real = images._pil_batches

    def dies_mid_way(model, pil, batch_size):
        for i, batch in enumerate(real(model, pil, batch_size)):
            if i == 1:
                raise KeyboardInterrupt
            yield batch

    monkeypatch.setattr(images, "_pil_batches", dies_mid_way)
    run_dir = tmp_path / "run"
    args = ["diagnose", *SIZE, "--limit", "4", "--batch-size", "2", "--out", str(run_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 130, result.output
    assert "interrupted" in flat(result.stderr)
    assert not (run_dir / "metrics.json").exists()


def test_crash_while_rendering_keeps_the_new_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vitreg.core.io import write_text_atomic
    from vitreg.core.run_dir import MANIFEST, claim, session
    from vitreg.errors import RenderError

    run_dir = tmp_path / "run"
    with session():  # an earlier run, replaced with --overwrite
        claim(run_dir, "diagnose", "planted:dinov2_s14")
        write_text_atomic(run_dir / "metrics.json", '{"stale": true}')

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(
        "vitreg.report.render.html.render_html", boom
    )  # after figures and report.md
    args = ["--debug", "diagnose", *SIZE, "--limit", "2", "--out", str(run_dir), "--overwrite"]
    result = runner.invoke(app, args)
    assert isinstance(result.exception, RenderError)
    assert isinstance(result.exception.__cause__, RuntimeError)
    assert not (run_dir / "report.md").exists()  # no report beside results it does not show
    doc = json.loads((run_dir / "metrics.json").read_text())
    assert doc["verb"] == "diagnose" and "stale" not in doc
    assert json.loads((run_dir / MANIFEST).read_text())["state"] == "incomplete"


@pytest.mark.slow
def test_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    tiny = ["--n-images=4", "--batch-size=2", "--img-size=56", "--depth=2", "--repeats=1"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "diagnose_speed.py"), *tiny, f"--out={out}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=HANG_GUARD_S, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and "ratio" in proc.stdout
    data = json.loads(out.read_text())
    assert data["settings"]["n_images"] == 4
    s = data["seconds"]
    assert s["diagnose"] > 0 and s["plain_forward"] > 0 and s["report"] > 0
    assert data["ratios"]["diagnose_plus_report_over_plain_plus_report"] == pytest.approx(
        (s["diagnose"] + s["report"]) / (s["plain_forward"] + s["report"])
    )
