"""Run directories: every file written, metrics.json valid and traceable, reports that say the truth."""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
import yaml

import vitreg
from _support.saved_config import SavedConfig
from vitreg.analysis.diagnose import DiagnoseResult, diagnose
from vitreg.analysis.ln_separation import LNAnalysis
from vitreg.analysis.norms import NormAnalysis
from vitreg.configs import DiagnoseConfig
from vitreg.errors import InputError, RenderError
from vitreg.report.render import plots
from vitreg.report.render.markdown import markdown_table
from vitreg.report.renderers import diagnose as diagnose_renderer
from vitreg.report.renderers.diagnose import model_rows, rows_table, write_diagnose_run
from vitreg.report.slider import Slider
from vitreg.report.writer import saved_slider
from vitreg.results.diagnose import DiagnoseResults
from vitreg.results.schema import Envelope, json_schema, resolve, validate_metrics
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build_unplanted


def write_run(out: Path, result: Any, **kwargs: Any) -> Path:
    """The run directory ``out`` of a diagnose result, written by the report layer's writer."""
    write_diagnose_run(out, result, **kwargs)
    return out


SIZE = 112
CONFIG = {"limit": 16, "batch_size": 8, "images": None, "rules": {"top_p": {"p": 2.0}}}
COMMAND = "vitreg diagnose planted:dinov2_s14 --img-size 112"
BASE_FIGURES = {"norm_maps", "norm_quantiles", "norm_histograms"}
LN_FIGURES = {"ln_similarity", "channel_ownership"}


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return synthetic_images(16, SIZE, seed=0, flat_fraction=0.1)


@pytest.fixture(scope="module")
def planted(images: torch.Tensor) -> DiagnoseResult:
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="synthetic"):
        model = vitreg.load("planted:dinov2_s14", img_size=SIZE)
    return diagnose(model, images, analyses=[NormAnalysis(), LNAnalysis()], batch_size=8)


@pytest.fixture(scope="module")
def unplanted(images: torch.Tensor) -> DiagnoseResult:
    torch.manual_seed(0)
    model = vitreg.wrap(build_unplanted("dinov2_s14", img_size=SIZE))
    return diagnose(model, images, analyses=[NormAnalysis(), LNAnalysis()], batch_size=8)


@pytest.fixture(scope="module")
def planted_run(
    tmp_path_factory: pytest.TempPathFactory, planted: DiagnoseResult, images: torch.Tensor
) -> Path:
    out = tmp_path_factory.mktemp("planted") / "run"
    return write_run(out, planted, images=images[:8], config=SavedConfig(CONFIG), command=COMMAND)


def load_metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def expected_numbers(result: DiagnoseResult) -> dict[str, object]:
    """Every headline metric recomputed from the typed results (not from the written file)."""
    rep = result.results.norms
    ratio = {
        "max_over_median": lambda lo: lo.quantiles.max / lo.quantiles.p50,
        "p98_over_median": lambda lo: lo.quantiles.p98 / lo.quantiles.p50,
    }
    out: dict[str, object] = {
        "artifacts_present": rep.artifacts_present,
        "emergence_layer": rep.emergence_layer,
        "outlier_rate": rep.evidence.outlier_rate,
        "norm_ratio.max_over_median.peak": max(ratio["max_over_median"](lo) for lo in rep.layers),
    }
    picks = {"last_layer": rep.layers[-1]}
    if rep.emergence_layer is not None:
        picks["emergence_layer"] = rep.layers[rep.emergence_layer]
    for where, lo in picks.items():
        out.update({f"outlier_rate.{m}.{where}": r for m, r in lo.outlier_rate.items()})
    for name, fn in ratio.items():
        out[f"norm_ratio.{name}.last_layer"] = fn(rep.layers[-1])
        out[f"norm_ratio.{name}.after_final_norm"] = fn(rep.after_final_norm)
    ln = result.results.ln_separation
    if ln is not None:
        for point in ("pre_ln1", "post_ln1"):
            vals = [b[point]["cls_patch"].mean for b in ln.similarity]
            out[f"cls_patch_similarity.{point}.mean_over_blocks"] = sum(vals) / len(vals)
        owned = [v for v in ln.owned_channel_fraction if v is not None]
        out["owned_channel_fraction.mean_over_blocks"] = sum(owned) / len(owned)
    attn = result.results.attention
    if attn is not None:
        layer = rep.evidence.strongest_layer
        site = rep.layers[layer].site if layer is not None else rep.layers[-1].site
        entry = next(a for a in attn.agreement if a.norm_site == site)
        keys = ("iou", "precision", "recall", "top_p_iou")
        out.update({f"attention_norm_{k}": getattr(entry, k) for k in keys})
    red = result.results.redundancy
    if red is not None:
        out["redundancy_auc.embed_n4"] = red.outlier_vs_normal["embed_n4"].auc
    return out


def assert_traceable(doc: dict, result: DiagnoseResult) -> None:
    expected = expected_numbers(result)
    names = {m["name"] for m in doc["metrics"]}
    assert names == set(expected), names ^ set(expected)
    for m in doc["metrics"]:
        want = expected[m["name"]]
        assert resolve(doc, m["source"], m["aggregate"]) == pytest.approx(m["value"])
        if isinstance(want, bool) or want is None:
            assert m["value"] == want, m["name"]
        else:
            assert m["value"] == pytest.approx(want, rel=1e-9), m["name"]


def test_write_run_writes_every_file(planted_run: Path) -> None:
    for name in ("config.yaml", "metrics.json", "report.md", "report.html"):
        assert (planted_run / name).stat().st_size > 0, name
    pngs = {p.stem: p.read_bytes() for p in (planted_run / "figures").glob("*.png")}
    assert set(pngs) == BASE_FIGURES | LN_FIGURES
    assert all(b.startswith(b"\x89PNG\r\n\x1a\n") for b in pngs.values())
    assert yaml.safe_load((planted_run / "config.yaml").read_text()) == CONFIG
    assert not list(planted_run.rglob("*.tmp"))
    pyplot = sys.modules.get("matplotlib.pyplot")
    assert pyplot is None or not pyplot.get_fignums()  # figures never go through pyplot


def test_the_writer_takes_the_typed_config_and_returns_the_typed_document(
    tmp_path: Path, unplanted: DiagnoseResult
) -> None:
    cfg = DiagnoseConfig(spec="planted:dinov2_s14", img_size=SIZE, limit=16)
    doc = write_diagnose_run(tmp_path / "run", unplanted, config=cfg, command="x")
    assert isinstance(doc, Envelope) and doc.results == unplanted.results
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved == cfg.to_file() == doc.config and saved["verb"] == "diagnose"
    assert load_metrics(tmp_path / "run") == doc.model_dump(mode="json")


def test_the_block_slider_is_typed_and_saved_as_built(planted_run: Path, tmp_path: Path) -> None:
    slider = saved_slider(planted_run)
    assert isinstance(slider, Slider) and slider.layers[slider.start].site.startswith("blocks.")
    saved = json.loads((planted_run / "figures" / "slider.json").read_text())
    assert slider.model_dump() == saved
    keys = ["label", "site", "where", "grid", "range", "maps", "attention"]
    assert list(saved) == ["cmap", "images", "layers", "attention", "start"]
    assert list(saved["layers"][0]) == keys  # the order the page's script was written for
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "slider.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="holds no slider object"):
        saved_slider(tmp_path)


def test_metrics_json_validates_and_traces_to_the_result(
    planted_run: Path, planted: DiagnoseResult
) -> None:
    doc = load_metrics(planted_run)
    validate_metrics(doc)
    assert (
        doc["schema_version"] == "2.0" and doc["verb"] == "diagnose" and doc["command"] == COMMAND
    )
    assert doc["torch_version"] == torch.__version__ and doc["timm_version"]
    assert doc["created"].endswith("+00:00")
    assert doc["model"]["spec"] == "planted:dinov2_s14" and doc["model"]["synthetic"]
    assert doc["model"]["dims"]["n_layers"] == 12
    assert doc["data"]["n_images"] == 16 and doc["config"] == CONFIG
    assert doc["results"]["norms"]["emergence_layer"] == 6
    assert_traceable(doc, planted)
    better = {m["name"]: m["higher_is_better"] for m in doc["metrics"]}
    assert better["outlier_rate"] is False and better["emergence_layer"] is None


def test_schema_rejects_untraceable_or_malformed_documents(planted_run: Path) -> None:
    doc = load_metrics(planted_run)
    bad = json.loads(json.dumps(doc))
    bad["metrics"][2]["value"] = 0.5  # no longer the number at its source
    with pytest.raises(pydantic.ValidationError, match="differs from"):
        validate_metrics(bad)
    bad = json.loads(json.dumps(doc))
    bad["created"] = "2026-01-01T00:00:00+02:00"
    with pytest.raises(pydantic.ValidationError, match="UTC"):
        validate_metrics(bad)
    bad = json.loads(json.dumps(doc))
    bad["metrics"][2]["value"] = math.nan
    with pytest.raises(pydantic.ValidationError, match="finite"):
        validate_metrics(bad)
    schema = json_schema()
    required = set(schema["$defs"]["DiagnoseDocument"]["required"])
    assert {"schema_version", "verb", "metrics", "results", "model"} <= required


def test_planted_report_says_synthetic_first_and_shows_the_evidence(planted_run: Path) -> None:
    md = (planted_run / "report.md").read_text()
    first = md.splitlines()[0]
    assert "SYNTHETIC" in first and "planted:dinov2_s14" in first
    assert "**Artifacts found.** From block 6 on" in md
    assert "**Emergence block:** 6" in md
    assert "| block | median norm | p98/median | max/median | top_p | robust_z | auto |" in md
    assert "flags the top p% of tokens in every model" in md
    assert "not visible after the final norm" in md  # the planted outliers vanish after ln_final
    links = [line.split("](")[1].rstrip(")") for line in md.splitlines() if line.startswith("![")]
    assert {Path(link).stem for link in links} == BASE_FIGURES | LN_FIGURES
    assert all((planted_run / link).is_file() for link in links)
    assert "Not available: the attention analysis was not run." in md


def test_unplanted_report_says_no_artifacts(
    tmp_path: Path, unplanted: DiagnoseResult, images: torch.Tensor
) -> None:
    run = write_run(
        tmp_path / "run", unplanted, images=images[:4], config=SavedConfig(), command="x"
    )
    md = (run / "report.md").read_text()
    # the unplanted control has random weights: no synthetic banner, the random-weights one
    assert md.startswith("**RANDOM WEIGHTS:**") and "SYNTHETIC" not in md.splitlines()[0]
    assert "**No artifacts found.**" in md and "**Emergence block:** none" in md
    assert "top_p rule still flags 2% of tokens at every block" in md
    doc = load_metrics(run)
    metrics = {m["name"]: m["value"] for m in doc["metrics"]}
    assert metrics["artifacts_present"] is False and metrics["emergence_layer"] is None
    assert metrics["outlier_rate.auto.last_layer"] == 0.0
    assert metrics["outlier_rate.top_p.last_layer"] > 0.0  # top_p flags tokens anyway
    assert_traceable(doc, unplanted)


def test_missing_analyses_degrade_to_one_line(tmp_path: Path, planted: DiagnoseResult) -> None:
    only_norms = replace(
        planted,
        results=DiagnoseResults(
            norms=planted.results.norms,
            not_applicable={"ln_separation": "the model has no [CLS] (test reason)"},
        ),
        traced={"norms": planted.traced["norms"]},
    )
    run = write_run(tmp_path / "run", only_norms, images=None, config=SavedConfig(), command="x")
    md = (run / "report.md").read_text()
    assert "Not available: the model has no [CLS] (test reason)." in md
    assert "Not available: the redundancy analysis was not run." in md
    assert "`ln_separation`: the model has no [CLS] (test reason)" in md
    assert {p.stem for p in (run / "figures").glob("*.png")} == BASE_FIGURES
    assert (
        "Not available: the model has no [CLS] (test reason)." in (run / "report.html").read_text()
    )
    doc = load_metrics(run)
    assert not any(m["name"].startswith("cls_patch") for m in doc["metrics"])
    assert_traceable(doc, only_norms)


def test_failed_rendering_keeps_the_new_results(
    tmp_path: Path, planted_run: Path, planted: DiagnoseResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    shutil.copytree(planted_run, run)  # a previous complete run: its report must not survive

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("figure failed")

    monkeypatch.setattr(diagnose_renderer, "norm_histograms", broken)
    with pytest.raises(RenderError, match="figure failed") as failed:
        write_run(run, planted, config=SavedConfig(), command="rendering fails")
    assert failed.value.saved == str(run / "metrics.json")
    assert failed.value.again == f"vitreg report {run}"
    doc = validate_metrics(load_metrics(run))
    assert doc.command == "rendering fails"  # this run's results, not the previous ones
    assert not (run / "report.md").exists() and not (run / "report.html").exists()
    assert not list(run.rglob("*.tmp"))


@pytest.mark.parametrize("fails", ["figures", "report"])
def test_the_writer_of_every_other_verb_saves_the_results_first(
    tmp_path: Path, planted_run: Path, fails: str
) -> None:
    """Every verb writes through the one writer: a failure saves the results."""
    from vitreg.report.writer import write_run as write_files

    def broken(*args: object) -> list:
        raise ValueError(f"{fails} failed")

    doc = load_metrics(planted_run)
    draw, build = (broken, None) if fails == "figures" else (lambda: [], broken)
    with pytest.raises(RenderError, match=f"{fails} failed") as failed:
        write_files(tmp_path / "run", doc, draw, build)
    assert failed.value.again == f"vitreg report {tmp_path / 'run'}"
    assert load_metrics(tmp_path / "run") == doc and (tmp_path / "run" / "config.yaml").is_file()
    assert not (tmp_path / "run" / "report.md").exists()


def test_a_model_comparison_renders_again_as_written(
    tmp_path: Path, planted_run: Path, planted: DiagnoseResult
) -> None:
    from vitreg.report.compare import write_model_comparison
    from vitreg.report.documents import read_metrics
    from vitreg.results.comparison import ModelComparison
    from vitreg.verbs.report import render_again

    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        shutil.copytree(planted_run, d)
    documents = [read_metrics(d) for d in dirs]
    written_doc = write_model_comparison(
        tmp_path, [("a", planted), ("b", planted)], dirs, documents
    )
    assert isinstance(written_doc, ModelComparison) and written_doc.runs[1].run_dir == "b"
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert saved == written_doc.model_dump(mode="json") and list(saved)[:2] == [
        "verb",
        "vitreg_version",
    ]
    written = (tmp_path / "comparison.md").read_text()
    (tmp_path / "comparison.md").unlink()
    assert render_again(tmp_path) == [tmp_path / "comparison.md", tmp_path / "report.html"]
    assert (tmp_path / "comparison.md").read_text() == written
    assert "figures/model_curves.png" in written


def test_model_rows_come_from_the_results(
    planted: DiagnoseResult, unplanted: DiagnoseResult
) -> None:
    rows = model_rows([("planted:dinov2_s14", planted), ("unplanted", unplanted)])
    md = markdown_table(rows_table(rows))
    lines = md.strip().splitlines()
    assert lines[0].startswith("| model | outlier rate | emergence block | max/median norm")
    assert len(lines) == 4 and "`planted:dinov2_s14`" in lines[2] and "| artifacts |" in lines[2]
    p, u = rows
    rep = planted.results.norms
    assert p["verdict"] == "artifacts" and p["emergence_layer"] == rep.emergence_layer == 6
    assert p["outlier_rate"] == rep.evidence.outlier_rate > 0.03
    peak = max(lo.quantiles.max / lo.quantiles.p50 for lo in rep.layers)
    assert p["norm_ratio.max_over_median.peak"] == pytest.approx(peak)
    assert p["attention_norm_iou"] is None  # attention was not run
    assert u["verdict"] == "no artifacts" and u["emergence_layer"] is None
    assert u["outlier_rate"] == 0.0


def test_display_images_undo_the_model_normalisation() -> None:
    x = torch.rand(2, 3, 8, 8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    normed = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    shown = plots.display_images(normed, mean, std)
    assert shown.shape == (2, 8, 8, 3)
    assert torch.allclose(torch.from_numpy(shown), x.permute(0, 2, 3, 1), atol=1e-5)
    rescaled = plots.display_images(normed)  # no mean/std: per-image range to [0, 1]
    assert rescaled.min() == 0.0 and rescaled.max() == 1.0


@pytest.mark.slow
def test_all_analyses_render_and_trace(tmp_path: Path, images: torch.Tensor) -> None:
    with pytest.warns(UserWarning, match="synthetic"):
        model = vitreg.load("planted:dinov2_s14", img_size=SIZE)
    result = diagnose(model, images, batch_size=8, max_maps=2)
    run = write_run(tmp_path / "run", result, images=images[:2], config=SavedConfig(), command="x")
    doc = load_metrics(run)
    assert_traceable(doc, result)
    md = (run / "report.md").read_text()
    assert "Not available" not in md
    assert "attention artifacts and norm outliers agree with IoU" in md
    assert {"attention_maps", "attention_heads", "attention_agreement", "redundancy_maps"} <= {
        p.stem for p in (run / "figures").glob("*.png")
    }


def test_figures_say_block_where_tables_do(planted: DiagnoseResult) -> None:
    """Axis labels, panel titles and captions of the diagnose figures count blocks, never layers."""
    import re

    from vitreg.report.render.plots import all_axes

    figs = diagnose_renderer.figures(planted, None)
    assert figs
    for f in figs:
        texts = [f.caption] + [
            t
            for ax in all_axes(f.source)
            for t in (ax.get_xlabel(), ax.get_ylabel(), ax.get_title())
        ]
        said = [t for t in texts if re.search(r"\blayers?\b", t, re.IGNORECASE)]
        assert not said, (f.name, said)
    labels = {ax.get_xlabel() for f in figs for ax in all_axes(f.source)}
    assert "block" in labels
