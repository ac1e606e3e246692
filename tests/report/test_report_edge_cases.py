"""Every verb's report renders (Markdown and HTML) from edge-case documents: real small runs
(planted demo models at tiny sizes, one image, one patch, a model without [CLS], registers) and,
from each, every field of its results block set in turn to None, NaN or empty, as the schema
allows (a mutation the schema refuses is skipped, and each headline is re-read from the mutated
results as the writer would have). The HTML of a mutated report renders the same sections as its
Markdown, so it is checked on a seeded share of them and on every unmutated document."""

from __future__ import annotations

import copy
import json
import math
import random
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import vitreg
from _support.saved_config import SavedConfig
from vitreg.analysis.diagnose import diagnose
from vitreg.configs import FixConfig, NeuronsConfig, ProbeRunConfig, VlmConfig
from vitreg.fix.neuron_set import NeuronSet
from vitreg.report.render.html import render_html
from vitreg.report.render.markdown import render_markdown
from vitreg.report.renderers.diagnose import diagnose_document
from vitreg.report.writer import saved_figures
from vitreg.results.schema import resolve, validate_metrics
from vitreg.testing.images import synthetic_images
from vitreg.verbs.report import renderer

pytestmark = pytest.mark.usefixtures("one_thread")
# what each kind of field becomes, one at a time ('*' in a path: every item of that list)
MUTATIONS: dict[str, tuple[Any, ...]] = {
    "int": (None, math.nan),
    "float": (None, math.nan),
    "bool": (None,),
    "str": (None, ""),
    "list": ([], None),
    "dict": ({}, None),
}
HTML_SHARE = 0.1  # of mutated documents whose HTML is rendered too (seeded)


def fields(node: Any, path: tuple[str, ...] = ("results",)) -> dict[tuple[str, ...], str]:
    """Every field under ``node`` as a path (list items as ``*``) and the kind of its value."""
    out: dict[tuple[str, ...], str] = {}
    items = node.items() if isinstance(node, dict) else (("*", v) for v in node)
    for key, value in items:
        here = (*path, key)
        kind = type(value).__name__
        if kind in MUTATIONS:
            out.setdefault(here, kind)
        if isinstance(value, dict | list):
            for sub, k in fields(value, here).items():
                out.setdefault(sub, k)
    return out


def _set(node: Any, path: tuple[str, ...], value: Any) -> None:
    head, rest = path[0], path[1:]
    if isinstance(node, list) and head == "*":
        keys: list[Any] = list(range(len(node)))
    elif isinstance(node, dict) and head in node:
        keys = [head]
    else:
        return
    for key in keys:
        if rest:
            _set(node[key], rest, value)
        else:
            node[key] = copy.deepcopy(value)


def mutated(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any] | None:
    """``doc`` with the field(s) at ``path`` set to ``value``, its headlines re-read."""
    out = copy.deepcopy(doc)
    _set(out, path, value)
    return reread(out)


def reread(doc: dict[str, Any]) -> dict[str, Any] | None:
    """``doc`` with each headline re-read from its results, as the writer would have written
    it (one whose source is gone is dropped); None when the schema does not allow it."""
    kept = []
    for m in doc["metrics"]:
        try:
            m["value"] = resolve(doc, m["source"], m.get("aggregate"))
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        kept.append(m)
    doc["metrics"] = kept
    try:
        validate_metrics(doc)
    except Exception:  # any refusal of the schema, pydantic's or a resolver's
        return None
    return doc


def render(doc: dict[str, Any], html: bool = True, figures: list | None = None) -> None:
    """The verb's report of ``doc`` (validated once, as ``vitreg report`` reads it) as Markdown
    (and HTML)."""
    report = renderer(doc["verb"]).report(validate_metrics(doc), figures or [])
    assert render_markdown(report).startswith(("#", "**"))
    if html:
        assert "<html" in render_html(report, figures or [], None)


def assert_every_edge_renders(doc: dict[str, Any], seed: int = 0) -> None:
    """The unmutated document, then every mutation of every results field, render."""
    render(doc)
    rng = random.Random(seed)
    failures, tried = [], 0
    for path, kind in fields(doc["results"]).items():
        for value in MUTATIONS[kind]:
            edge = mutated(doc, path, value)
            if edge is None:
                continue
            tried += 1
            try:
                render(edge, html=rng.random() < HTML_SHARE)
            except Exception as e:
                failures.append(f"{'/'.join(path)} = {value!r}: {type(e).__name__}: {e}")
    assert tried > 20, "the document has fields to mutate"
    assert not failures, f"{len(failures)} of {tried} edge cases fail:\n" + "\n".join(failures[:25])


def emptied(doc: dict[str, Any], block: str) -> dict[str, Any] | None:
    """``doc`` with every field of ``results[block]`` emptied at once (an analysis that saw
    nothing), its headlines re-read; None when the schema refuses it."""
    out = copy.deepcopy(doc)
    node = out["results"][block]
    for key, value in node.items():
        node[key] = type(value)() if isinstance(value, dict | list | str) else None
    return reread(out)


# diagnose: cheap real runs ------------------------------------------------------------------
def diagnosed(spec: str, size: int, n: int, **kwargs: Any) -> dict[str, Any]:
    """The metrics.json document of a diagnose run of ``spec`` on ``n`` synthetic images (a
    one-patch model is wrapped: ``vitreg.load`` refuses fewer than 2x2 patches)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the planted models say they are synthetic
        if size // 14 < 2:
            import timm

            arch = "vit_small_patch14_dinov2"
            module = timm.create_model(arch, pretrained=False, img_size=size, depth=2).eval()
            model = vitreg.wrap(module, spec=spec)
        else:
            model = vitreg.load(spec, img_size=size, **kwargs)
    images = synthetic_images(n, size, seed=0, flat_fraction=0.3)
    result = diagnose(model, images, batch_size=4, max_maps=1)
    doc = diagnose_document(result, SavedConfig({"img_size": size}), f"vitreg diagnose {spec}")
    return doc.model_dump(mode="json")  # as its metrics.json holds it, to mutate


@pytest.fixture(scope="module")
def diagnose_docs() -> dict[str, dict[str, Any]]:
    siglip = {"pretrained": False, "depth": 2, "embed_dim": 64, "num_heads": 2}
    return {
        "planted": diagnosed("planted:dinov2_s14", 56, 4),
        "one image": diagnosed("planted:dinov2_s14", 56, 1),
        "one patch": diagnosed("planted:dinov2_s14", 14, 2),  # no outlier patch: issue 23
        "registers": diagnosed("planted:dinov2_s14_reg4", 56, 2),
        "no [CLS] (SigLIP)": diagnosed("timm:vit_base_patch16_siglip_224", 32, 2, **siglip),
    }


@pytest.mark.parametrize(
    "name", ["planted", "one image", "one patch", "registers", "no [CLS] (SigLIP)"]
)
def test_diagnose_report_renders_every_edge(diagnose_docs, name: str) -> None:
    assert_every_edge_renders(diagnose_docs[name], seed=len(name))


def test_the_edge_documents_are_the_edges_they_claim(diagnose_docs) -> None:
    """One patch has no outlier patch (the redundancy block of issue 23); SigLIP has no [CLS];
    reg4 has registers; the one-image run saw one image."""
    red = diagnose_docs["one patch"]["results"]["redundancy"]
    assert any(v["outlier"] is None for v in red["outlier_vs_normal"].values())
    assert diagnose_docs["no [CLS] (SigLIP)"]["model"]["layout"]["n_cls"] == 0
    assert diagnose_docs["registers"]["model"]["layout"]["n_reg"] == 4
    assert diagnose_docs["one image"]["data"]["n_images"] == 1


def test_all_patches_outliers_and_analyses_that_saw_nothing_render(diagnose_docs) -> None:
    doc = copy.deepcopy(diagnose_docs["planted"])
    red = doc["results"]["redundancy"]
    red.update(outlier_rate=1.0, n_outliers=doc["data"]["n_images"] * math.prod(red["layer_grid"]))
    for v in red["outlier_vs_normal"].values():
        v.update(normal=None, auc=None)  # every patch an outlier: no normal patch to compare
    render(reread(doc))
    for block in ("redundancy", "attention", "ln_separation", "feature_pictures"):
        absent = copy.deepcopy(diagnose_docs["planted"])
        absent["results"][block] = None  # the analysis did not run
        absent = reread(absent)
        assert absent is not None, block
        render(absent)
    for block in ("redundancy", "attention", "ln_separation", "feature_pictures", "norms"):
        empty = emptied(diagnose_docs["planted"], block)
        if empty is not None:  # an empty block the types allow (no feature picture) renders
            render(empty)
    # a norms block of empty fields is not a result: the types refuse it before any renderer
    assert emptied(diagnose_docs["planted"], "norms") is None


# the other verbs: real small runs (minutes on two cores) ------------------------------------
@pytest.fixture(scope="module")
def planted_neurons(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The planted model's ground-truth register neurons as a NeuronSet file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = vitreg.load("planted:dinov2_s14", img_size=56)
    truth = model.module.vitreg_planted
    return NeuronSet.from_pairs(truth.units, model).save(tmp_path_factory.mktemp("n") / "truth")


def run_document(config: Any) -> tuple[dict[str, Any], Path]:
    run = vitreg.run(config)
    return json.loads((run.run_dir / "metrics.json").read_text()), run.run_dir


@pytest.mark.slow
def test_neurons_report_renders_every_edge(tmp_path: Path) -> None:
    doc, run_dir = run_document(
        NeuronsConfig(spec="planted:dinov2_s14", img_size=112, limit=8, out=tmp_path / "n")
    )
    render(doc, figures=saved_figures(run_dir))
    assert_every_edge_renders(doc, seed=1)


@pytest.mark.slow
def test_fix_report_renders_every_edge(tmp_path: Path, planted_neurons: Path) -> None:
    config = FixConfig(
        spec="planted:dinov2_s14", img_size=56, limit=4, neurons=str(planted_neurons)
    )
    doc, run_dir = run_document(config.model_copy(update={"out": tmp_path / "f"}))
    render(doc, figures=saved_figures(run_dir))
    assert_every_edge_renders(doc, seed=2)


@pytest.mark.slow
def test_probe_report_renders_every_edge(tmp_path: Path, planted_neurons: Path) -> None:
    config = ProbeRunConfig(
        spec="planted:dinov2_s14",
        img_size=28,
        fix="both",
        neurons=str(planted_neurons),
        data="synthetic-cls:n=16,size=28",
        epochs=2,
        seeds=2,
        out=tmp_path / "p",
    )
    doc, _ = run_document(config)
    assert set(doc["results"]["conditions"]) == {"base", "fixed"}  # the Δ column is rendered
    assert_every_edge_renders(doc, seed=3)


@pytest.mark.slow
def test_vlm_report_renders_every_edge(tmp_path: Path) -> None:
    from _support.vlm_helpers import tiny_llava_with_truth

    spec, neurons = tiny_llava_with_truth(tmp_path)
    config = VlmConfig(
        spec=spec,
        prompt="What is in the image?",
        neurons=neurons,
        max_new_tokens=2,
        limit=2,
        out=tmp_path / "v",
    )
    doc, _ = run_document(config)
    assert_every_edge_renders(doc, seed=4)


@pytest.mark.slow
def test_experiment_report_renders_every_edge(tmp_path: Path) -> None:
    from vitreg.experiment import grid, preset, run_variants

    settings = preset("tiny").with_(
        steps=1,
        batch_size=4,
        img_size=32,
        depth=2,
        embed_dim=32,
        num_heads=2,
        probe_epochs=1,
        diagnose_images=2,
        batch_eval=8,
    )
    variants = [v for v in grid() if v.name == "baseline-none"]
    run_variants("synthetic:n=8,size=32", tmp_path, settings, variants=variants, command="t")
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert_every_edge_renders(doc, seed=5)
