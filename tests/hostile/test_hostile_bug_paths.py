"""The last hostile inputs that ended in "this is a bug" or said the wrong thing, one test per
class: each is exit 2 with one paragraph naming the cause, or a counted, reported skip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import vitreg
from _support.cli_helpers import assert_clean_failure, flat
from vitreg.cli.app import app
from vitreg.errors import WeightsError

runner = CliRunner()


def test_config_duplicate_key_and_boolean_number_are_refused_with_the_key(tmp_path) -> None:
    twice = tmp_path / "twice.yaml"
    twice.write_text("verb: diagnose\nlimit: 3\nlimit: 5\n")
    result = runner.invoke(app, ["diagnose", "--config", str(twice), "--out", str(tmp_path / "a")])
    assert_clean_failure(result, "'limit' twice", "line 3")
    flag = tmp_path / "flag.yaml"
    flag.write_text("verb: diagnose\nlimit: true\n")
    result = runner.invoke(app, ["diagnose", "--config", str(flag), "--out", str(tmp_path / "b")])
    assert_clean_failure(result, "limit is true, but limit is a number")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_folder_of_non_images_says_no_image_could_be_read(tmp_path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(5):  # fewer than discovery's hold-out needs: the files are read first
        (folder / f"f{i}.jpg").write_text(f"not an image {i}")
    out = tmp_path / "run"
    args = ["neurons", "planted:dinov2_s14", "--img-size", "56", "--images", str(folder)]
    result = runner.invoke(app, [*args, "--out", str(out)])
    err = assert_clean_failure(result, "no readable image", "f0.jpg: could not be decoded")
    assert "holds out" not in err and not out.exists()


class Marker:
    """Unpickling this creates a file: proof that a pickle was (not) executed."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickled_bin_in_a_hugging_face_folder_is_named_and_never_run(tmp_path) -> None:
    pytest.importorskip("transformers")
    from transformers import Dinov2Config, Dinov2Model

    folder, marker = tmp_path / "hf", tmp_path / "PWNED"
    config = Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, image_size=28, patch_size=14)  # fmt: skip
    model = Dinov2Model(config)
    model.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    torch.save({**model.state_dict(), "evil": Marker(marker)}, folder / "pytorch_model.bin")
    for spec in (f"hf:{folder}", f"local:{folder}"):
        result = runner.invoke(app, ["inspect", spec])
        err = assert_clean_failure(result, "pytorch_model.bin", "pickled Python objects")
        assert "weights_only` set to `False" not in err and "False" not in err
    assert not marker.exists()


def test_a_vlm_folder_of_pickled_weights_is_named_without_torch_advice(tmp_path) -> None:
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from vitreg.testing.planted import save_tiny_llava

    folder, marker = save_tiny_llava(tmp_path / "llava"), tmp_path / "PWNED"
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save({**state, "evil": Marker(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(WeightsError, match="no readable model.safetensors: it holds pytorch_"):
        vitreg.load(f"hf-vlm:{folder}")
    for spec in (f"hf-vlm:{folder}", f"hf:{folder}"):
        err = assert_clean_failure(runner.invoke(app, ["inspect", spec]), "pytorch_model.bin")
        assert "weights_only" not in err.replace("weights_only=True", "")
    assert not marker.exists()


GOLDEN = Path(__file__).parents[1] / "report" / "_golden"


def golden_run(folder: Path, name: str, edit=None) -> Path:
    """A copy of a golden run's metrics.json (``edit``ed) with its companion files."""
    doc = json.loads((GOLDEN / name / "metrics.json").read_text())
    if edit is not None:
        edit(doc)
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(doc))
    for companion in ("config.yaml", "report.md", "report.html"):
        (folder / companion).write_text("x")
    return folder


def test_validate_refuses_a_headline_whose_source_is_its_own_value(tmp_path) -> None:
    good = golden_run(tmp_path / "good", "train")
    ok = runner.invoke(app, ["validate", str(good)])
    assert ok.exit_code == 0, ok.output

    def self_pointer(doc: dict) -> None:
        doc["metrics"][0]["value"] = 123.0
        doc["metrics"][0]["source"] = "/metrics/0/value"

    bad = golden_run(tmp_path / "bad", "train", self_pointer)
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2 and "bug" not in result.output
    assert "which is not in results" in flat(result.stdout)


def test_compare_notes_a_run_off_the_schema_and_a_nan_headline(tmp_path) -> None:
    good = golden_run(tmp_path / "good", "schema_1_1_diagnose")
    off = golden_run(
        tmp_path / "off", "schema_1_1_diagnose", lambda d: d["results"].update(norms=5)
    )

    def nan(doc: dict) -> None:
        doc["metrics"][1]["value"] = float("nan")

    missing = golden_run(tmp_path / "bad_value", "schema_1_1_diagnose", nan)
    name = json.loads((good / "metrics.json").read_text())["metrics"][1]["name"]
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", str(good), str(off), str(missing), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = flat(result.stdout)
    bare = "".join(text.split())  # rich may wrap a long path anywhere, even inside a word
    for needle in (
        f"note: {off}: its metrics.json does not follow the result schema (results.norms",
        f"note: {missing}: the headline {name!r} is nan",
    ):
        assert "".join(needle.split()) in bare, text
    assert text.lower().count("nan") == 1  # in the note, never as a value in the table
    merged = json.loads((out / "comparison.json").read_text())
    assert len(merged["notes"]) == 2 and merged["rows"][1]["values"][2] is None
    assert "is nan in its metrics.json" in (out / "comparison.md").read_text()


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("planted:nope", "unknown planted model 'nope'"),
        ("timm:vit_nonexistent_xyz", "timm has no model named"),
        ("local:/no/such/folder", "local model directory"),
        ("nosource:x", "unknown model source"),
        ("hf:../x", "neither a local directory nor a hub id"),
    ],
)
def test_every_models_spec_is_resolved_before_the_first_model_loads(
    tmp_path, monkeypatch, bad, needle
) -> None:
    import vitreg.models.load as loading

    loaded: list[str] = []
    real = loading.load
    monkeypatch.setattr(
        loading, "load", lambda spec, *a, **k: loaded.append(spec) or real(spec, *a, **k)
    )
    out = tmp_path / "run"
    models = f"planted:dinov2_s14,{bad}"
    result = runner.invoke(app, ["diagnose", "--models", models, "--out", str(out)])
    assert_clean_failure(result, "--models:", needle, "no model was loaded")
    assert loaded == [] and not out.exists()
