"""Outlier rules, presence test, emergence layer and verdict: planted truth vs unplanted controls."""

import math

import numpy as np
import pytest
import torch

import vitreg
from vitreg.analysis.norms import norm_report, outliers
from vitreg.analysis.rules import threshold
from vitreg.analysis.thresholds import bimodal_fit
from vitreg.results.diagnose import Bimodal, Norms
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build, build_unplanted

SIZE = 112
FAST = ["dinov2_s14", "dinov2_s14_reg4", "dinov2_s14_swiglu", "deit3_s16"]


@pytest.fixture(scope="module")
def images():
    return synthetic_images(16, size=SIZE, seed=1, flat_fraction=0.1)


def test_rules_on_known_distributions():
    rng = np.random.default_rng(0)
    bulk = rng.lognormal(np.log(40), 0.25, 20000)
    spikes = rng.lognormal(np.log(400), 0.2, 400)
    both = np.r_[bulk, spikes]
    fit = bimodal_fit(both)
    assert isinstance(fit, Bimodal)
    assert fit.present and 8 < fit.mode_ratio < 12
    flagged = both > fit.threshold
    assert flagged[-400:].mean() == 1.0 and flagged[:-400].mean() == 0.0
    assert not bimodal_fit(bulk).present and math.isinf(threshold(bulk, "auto"))
    # top_p flags p% of any distribution; robust_z flags almost nothing in a unimodal one
    assert abs((bulk > threshold(bulk, "top_p", p=2)).mean() - 0.02) < 1e-3
    assert (bulk > threshold(bulk, "robust_z", z=3.5)).mean() < 0.002
    assert threshold(both, "absolute", value=150) == 150
    with pytest.raises(ValueError, match="needs a threshold"):
        threshold(both, "absolute")
    with pytest.raises(ValueError, match="unknown outlier method"):
        threshold(both, "median")
    assert not bimodal_fit(np.full(100, 3.0)).present


@pytest.mark.parametrize("name", FAST)
def test_planted_verdict_layer_and_tokens(name, images):
    module, truth = build(name, img_size=SIZE)
    model = vitreg.wrap(module)
    found = norm_report(model, images, batch_size=8)
    trace = found.trace
    report = outliers(trace)
    assert isinstance(report, Norms) and report == found.summary
    assert report.artifacts_present
    assert report.emergence_layer == truth.first_outlier_layer
    site = trace.sites[truth.first_outlier_layer]
    flagged = found.masks(site, "auto")
    want = truth.outlier_mask(images)
    sure = ~truth.ambiguous_mask(images)
    tp = (flagged & want & sure).sum().item()
    precision = tp / max((flagged & sure).sum().item(), 1)
    recall = tp / max((want & sure).sum().item(), 1)
    assert precision >= 0.95 and recall >= 0.95, (precision, recall)
    # norms are taken on the residual stream; after the final norm the outliers can vanish
    assert report.after_final_norm is not None
    assert report.verdict == "artifacts"
    assert report.layers[truth.first_outlier_layer].artifacts_present


@pytest.mark.parametrize("name", FAST)
def test_unplanted_controls_have_no_artifacts_but_top_p_flags_anyway(name, images):
    model = vitreg.wrap(build_unplanted(name, img_size=SIZE))
    report = norm_report(model, images, batch_size=8).summary
    assert not report.artifacts_present and report.emergence_layer is None
    assert report.verdict == "no artifacts"
    last = report.layers[-1]
    assert last.outlier_rate["auto"] == 0.0 and last.thresholds["auto"] is None
    assert last.outlier_rate["top_p"] == pytest.approx(0.02, abs=0.005)  # flagged by construction


def test_absolute_rule_and_json_ready(images):
    model = vitreg.wrap(build("dinov2_s14", img_size=SIZE)[0])
    trace = norm_report(model, images[:4], batch_size=4).trace
    report = outliers(trace, rules={"absolute": {"value": 1e9}, "top_p": {"p": 5}})
    assert set(report.rules) == {"absolute", "top_p", "auto"}
    assert report.layers[-1].outlier_rate["absolute"] == 0.0
    import json

    json.loads(report.model_dump_json())  # plain numbers only
    with pytest.raises(ValueError, match="unknown outlier method"):
        outliers(trace, rules={"bogus": {}})


def test_norms_after_final_norm_are_reported_separately():
    model = vitreg.load("timm:vit_small_patch14_dinov2", pretrained=False, depth=2, img_size=56)
    trace = norm_report(model, torch.randn(3, 3, 56, 56)).trace
    assert trace.final_site == "ln_final.hook_out"
    assert trace.sites == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert trace.patch_maps("blocks.1.hook_resid_post").shape == (3, 4, 4)
    report = outliers(trace)
    assert report.after_final_norm.site == "ln_final.hook_out"
