"""``diagnose`` returns its results typed once: the results models metrics.json holds, the
tensors behind the figures on holders that keep only those tensors and the same summary."""

from __future__ import annotations

import importlib

import pytest
import torch

import vitreg
from _support.saved_config import SavedConfig
from vitreg.analysis.diagnose import DiagnoseResult, data_block, diagnose
from vitreg.analysis.ln_separation import LNAnalysis
from vitreg.analysis.norms import NormsResult
from vitreg.errors import InputError
from vitreg.report.renderers.diagnose import diagnose_document
from vitreg.results import diagnose as typed
from vitreg.results import kinds
from vitreg.results.schema import DataInfo
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build

BLOCKS = {
    "norms": typed.Norms,
    "attention": typed.Attention,
    "redundancy": typed.Redundancy,
    "ln_separation": typed.LNSeparation,
    "feature_pictures": typed.FeaturePictures,
    "kinds": kinds.Kinds,
    "sinks": kinds.Sinks,
    "massive": kinds.Massive,
    "lof": kinds.LOF,
    "positions": kinds.Positions,
    "registers": kinds.Registers,
}


@pytest.fixture(scope="module")
def model() -> vitreg.Model:
    torch.manual_seed(0)
    return vitreg.wrap(build("dinov2_s14", img_size=56)[0])


@pytest.fixture(scope="module")
def result(model: vitreg.Model) -> DiagnoseResult:
    return diagnose(model, synthetic_images(4, 56, seed=0, flat_fraction=0.1), batch_size=2)


def test_every_block_is_its_results_model(result: DiagnoseResult) -> None:
    assert isinstance(result.results, typed.DiagnoseResults)
    for name, model_type in BLOCKS.items():
        assert isinstance(getattr(result.results, name), model_type), name
    assert result.verdict is result.results.norms.artifacts_present
    assert isinstance(result.data, DataInfo)
    assert result.data.n_images == 4 and result.results.not_applicable == {}
    assert not hasattr(result, "to_dict")


def test_the_images_are_described_by_data_info() -> None:
    assert data_block(4, None) == DataInfo(n_images=4)
    given = DataInfo(description="the folder /data", n_images=3, skipped={"a.txt": "no image"})
    assert data_block(4, given) is given
    with pytest.warns(DeprecationWarning, match="DataInfo"):
        old = data_block(4, {"description": "the folder /data", "source": "folder"})  # type: ignore[arg-type]
    assert isinstance(old, DataInfo) and old.n_images == 4
    assert old.model_dump() == {
        "description": "the folder /data",
        "n_images": 4,
        "skipped": {},
        "converted": {},
        "source": "folder",
    }


def test_holders_keep_tensors_and_the_same_summary(result: DiagnoseResult) -> None:
    assert set(result.traced) == {
        "norms",
        "attention",
        "redundancy",
        "ln_separation",
        "feature_pictures",
    }
    for name, holder in result.traced.items():
        assert holder.summary is getattr(result.results, name), name
        assert not hasattr(holder, "to_dict"), name
    norms = result.traced["norms"]
    assert isinstance(norms, NormsResult)
    site = norms.summary.layers[-1].site
    flagged = norms.masks(site, "top_p").float().mean().item()
    assert flagged == pytest.approx(norms.summary.layers[-1].outlier_rate["top_p"])


def test_the_document_holds_the_results_as_returned(result: DiagnoseResult) -> None:
    doc = diagnose_document(result, SavedConfig(), "vitreg diagnose (test)")
    assert doc.results == result.results
    names = {m.name for m in doc.metrics}
    assert {"artifacts_present", "emergence_layer", "outlier_rate"} <= names


def test_diagnose_needs_the_norms(model: vitreg.Model) -> None:
    x = synthetic_images(2, 56, seed=1)
    with pytest.raises(InputError, match="NormAnalysis"):
        diagnose(model, x, analyses=[LNAnalysis()])


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("thresholds", "BimodalFit", "Bimodal"),
        ("norms", "LayerOutliers", "SiteNorms"),
        ("norms", "OutlierReport", "Norms"),
        ("sinks", "SinkHead", "SinkHeadRow"),
        ("sinks", "SinkResult", "Sinks"),
        ("massive", "MassiveChannel", "MassiveChannelRow"),
        ("massive", "MassiveResult", "Massive"),
        ("anomaly_lof", "LOFResult", "LOF"),
        ("positions", "PositionResult", "Positions"),
        ("registers", "RegisterResult", "Registers"),
        ("kinds", "KindVerdict", "KindRow"),
        ("kinds", "KindsResult", "Kinds"),
        ("feature_pictures", "FeaturePictures", "SiteFeatures"),
    ],
)
def test_an_old_result_name_warns_and_gives_the_new_one(module: str, old: str, new: str) -> None:
    found = importlib.import_module(f"vitreg.analysis.{module}")
    with pytest.warns(DeprecationWarning, match=f"{old} is now .*{new}"):
        assert getattr(found, old) is getattr(found, new)
