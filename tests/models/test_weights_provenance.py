"""Where the weights come from is recorded by how the model was loaded, and every report of a
model that is not trained says so in its first line, the Python API's included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import vitreg
from _support.saved_config import SavedConfig
from conftest import images
from vitreg.analysis.diagnose import diagnose
from vitreg.models.loaders.local import save_local
from vitreg.report.renderers.diagnose import write_diagnose_run
from vitreg.results.schema import is_synthetic, validate_metrics


def write_run(out: Path, result: Any, **kwargs: Any) -> Path:
    """The run directory ``out`` of a diagnose result, written by the report layer's writer."""
    write_diagnose_run(out, result, **kwargs)
    return out


TINY = dict(depth=2, img_size=56)
ARCH = "timm:vit_small_patch14_dinov2"


def test_python_api_run_on_random_weights_says_so_in_metrics_and_report(tmp_path):
    model = vitreg.load(ARCH, pretrained=False, **TINY)
    assert model.weights == "random"
    x = images(4, 56)
    out = write_run(
        tmp_path / "run", diagnose(model, x), images=x, config=SavedConfig(), command="script"
    )
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["model"]["weights"] == "random"
    assert "random_init" not in doc["config"]  # the flag comes from the model, not an option
    assert (out / "report.md").read_text().startswith("**RANDOM WEIGHTS:**")
    assert "RANDOM WEIGHTS" in (out / "report.html").read_text()
    validate_metrics(doc)


def test_runs_written_before_the_field_still_validate(tmp_path):
    model = vitreg.load(ARCH, pretrained=False, **TINY)
    x = images(4, 56)
    out = write_run(tmp_path / "run", diagnose(model, x), config=SavedConfig(), command="script")
    doc = json.loads((out / "metrics.json").read_text())
    del doc["model"]["weights"]
    validate_metrics(doc)
    doc["model"]["weights"] = "borrowed"
    with pytest.raises(ValueError, match="weights"):
        validate_metrics(doc)


def test_each_way_of_loading_records_its_kind(tmp_path):
    torch.manual_seed(0)
    module = vitreg.load(ARCH, pretrained=False, **TINY).module
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path))
    assert vitreg.load(ARCH, weights=path, **TINY).weights == "user"
    plain = vitreg.load(ARCH, pretrained=False, **TINY).module
    plain.vitreg_weights = None  # as timm built it, unknown to vitreg
    assert vitreg.wrap(plain).weights == "user"
    assert vitreg.wrap(plain, weights="trained").describe().weights == "trained"
    with pytest.raises(vitreg.errors.InputError, match="weights must be one of"):
        vitreg.wrap(plain, weights="pretrained")
    save_local(plain, tmp_path / "mine", **TINY)
    assert "vitreg_weights" not in json.loads((tmp_path / "mine" / "config.json").read_text())
    assert vitreg.load(f"local:{tmp_path / 'mine'}").weights == "user"
    assert vitreg.load(f"local:{tmp_path / 'mine'}", pretrained=False).weights == "random"


def test_saved_random_and_planted_models_keep_their_kind_and_banner(tmp_path):
    from vitreg.testing.planted import build

    random = vitreg.load(ARCH, pretrained=False, **TINY)
    save_local(random.module, tmp_path / "random", **TINY)
    with pytest.warns(UserWarning, match="random, untrained"):
        again = vitreg.load(f"local:{tmp_path / 'random'}")
    assert again.weights == "random"

    module, truth = build("dinov2_s14", img_size=56)
    assert vitreg.wrap(module).weights == "planted"
    save_local(module, tmp_path / "planted", **truth.model_args)
    with pytest.warns(UserWarning, match="synthetic"):
        again = vitreg.load(f"local:{tmp_path / 'planted'}")
    assert again.weights == "planted"
    assert is_synthetic(again.describe())
    # a folder may say its weights are random or planted, never vouch that they are trained
    config = tmp_path / "planted" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "vitreg_weights": "trained"}))
    assert vitreg.load(f"local:{tmp_path / 'planted'}").weights == "user"


def test_a_saved_planted_fix_reloads_as_synthetic(tmp_path):
    from vitreg import NeuronSet, TestTimeRegisters
    from vitreg.fix.saved import save_fixed

    model = vitreg.load("planted:dinov2_s14", img_size=56)
    truth = model.module.vitreg_planted
    neurons = NeuronSet.from_pairs(truth.causal_units, model)
    out = save_fixed(model, TestTimeRegisters(neurons), tmp_path / "fixed", **truth.model_args)
    with pytest.warns(UserWarning, match="synthetic"):
        again = vitreg.load(f"local:{out}")
    assert again.weights == "planted" and again.layout.n_extra == 1
    assert any(n.startswith("synthetic") for n in again.notes)
