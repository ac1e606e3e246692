"""The CLI without traps: ``--out`` checked and never clobbered, inputs checked before any model
loads, unexpected errors reported as bugs (traceback only with ``--debug``), help without type
noise on flags, and ``--weights FILE`` equal to the same weights in a ``local:`` folder."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import timm
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file
from typer.testing import CliRunner

import vitreg.verbs
from _support.cli_helpers import flat
from vitreg.cli.app import app
from vitreg.core.io import write_bytes_atomic, write_json_atomic, write_text_atomic
from vitreg.core.out_dir import check_out
from vitreg.core.run_dir import session
from vitreg.errors import InputError
from vitreg.report.render.envelope import synthetic_banner
from vitreg.report.render.markdown import render_markdown
from vitreg.report.renderers.diagnose import diagnose_document, report
from vitreg.verbs import diagnose as verb_diagnose
from vitreg.verbs import loading

runner = CliRunner()


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if any command starts loading a model."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(loading, "load_spec", refuse)  # inspect imports it when it runs


def fake_run(folder: Path, verb: str, spec: str, finish: bool = True) -> Path:
    """A run directory as ``verb`` leaves it (manifest, metrics.json, config.yaml, report, a
    figure); ``finish=False``: one that ended with an error before it was complete."""
    with contextlib.suppress(RuntimeError), session():
        check_out(folder, verb, spec)
        write_bytes_atomic(folder / "figures" / "norms.png", b"png")
        write_text_atomic(folder / "report.md", "# old\n")
        write_text_atomic(folder / "config.yaml", yaml.safe_dump({"verb": verb, "spec": spec}))
        write_json_atomic(folder / "metrics.json", {"verb": verb, "model": {"spec": spec}})
        if not finish:
            raise RuntimeError("the run failed")
    return folder


# ----------------------------------------------------------------------------- --out
def test_out_must_be_a_writable_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file, not a folder"):
        check_out(tmp_path / "file", "diagnose", "planted:dinov2_s14")
    with pytest.raises(InputError, match="cannot be written"):
        check_out(tmp_path / "file" / "below", "diagnose", "planted:dinov2_s14")
    with session():
        check_out(tmp_path / "new" / "run", "diagnose", "planted:dinov2_s14")
    assert not (tmp_path / "new").exists()  # a run that wrote nothing leaves nothing behind
    with pytest.raises(InputError, match="cannot be written"):
        check_out(Path("/proc/vitreg-cannot-be-here"), "diagnose", "planted:dinov2_s14")


def test_a_used_out_is_refused_unless_overwrite_removes_the_old_run(tmp_path):
    old = fake_run(tmp_path / "run", "neurons", "planted:dinov2_s14")
    with pytest.raises(InputError, match="holds a `vitreg neurons` run of planted:dinov2_s14"):
        check_out(old, "fix", "planted:dinov2_s14")
    with pytest.raises(InputError, match="this same command on this model"):
        check_out(old, "neurons", "planted:dinov2_s14")
    with pytest.raises(InputError, match="not a `vitreg fix` run of planted:deit3_s16"):
        check_out(old, "fix", "planted:deit3_s16")
    with session():
        check_out(old, "fix", "planted:dinov2_s14", overwrite=True)
    assert sorted(p.name for p in old.iterdir()) == []


def test_train_resumes_its_own_run_and_refuses_another(tmp_path):
    run = fake_run(tmp_path / "train", "train", "vit_tiny_patch16_224", finish=False)
    with pytest.raises(InputError, match="partial files of a `vitreg train` run"):
        check_out(run, "diagnose", "vit_tiny_patch16_224")
    with session():
        check_out(run, "train", "vit_tiny_patch16_224")  # resume its unfinished run: allowed
    assert (run / "metrics.json").is_file()
    with pytest.raises(InputError, match="not a `vitreg train` run of vit_small"):
        check_out(run, "train", "vit_small_patch16_224")


def test_cli_refuses_a_used_out_before_loading_and_overwrite_clears_it_first(tmp_path, no_model):
    old = fake_run(tmp_path / "run", "neurons", "planted:dinov2_s14")
    refused = runner.invoke(app, ["fix", "--out", str(old), "--neurons", "builtin"])
    assert refused.exit_code == 2, refused.output
    assert "--overwrite" in flat(refused.stderr) and (old / "figures" / "norms.png").exists()
    (tmp_path / "empty").mkdir()  # fails right after --out is prepared: no model work at all
    args = ["diagnose", "--out", str(old), "--images", str(tmp_path / "empty"), "--overwrite"]
    cleared = runner.invoke(app, args)
    assert cleared.exit_code == 2 and "Traceback" not in cleared.output
    assert not (old / "figures").exists() and not (old / "metrics.json").exists()
    (tmp_path / "f").write_text("x")
    for verb in ("diagnose", "neurons", "fix", "probe"):
        result = runner.invoke(app, [verb, "--out", str(tmp_path / "f")])
        assert result.exit_code == 2 and "is a file, not a folder" in flat(result.stderr), verb


# ----------------------------------------------------------------------------- inputs first
def test_inputs_are_checked_before_the_model_loads(tmp_path, no_model):
    out = ["--out", str(tmp_path / "out")]
    cases = {
        "fix --neurons": ["fix", "--neurons", str(tmp_path / "nope.json"), *out],
        "fix --images": ["fix", "--images", str(tmp_path / "missing"), *out],
        "neurons --images": ["neurons", "--images", str(tmp_path / "missing"), *out],
        "probe --neurons": ["probe", "--fix", "both", "--neurons", "nope.json", *out],
        "probe --data": ["probe", "--data", f"imagefolder:{tmp_path / 'missing'}", *out],
        # the demo model has no built-in neuron set: refused before it is built
        "probe --neurons builtin": ["probe", "--fix", "both", "--neurons", "builtin", *out],
        "fix --neurons builtin": ["fix", "--neurons", "builtin", *out],
        "diagnose --weights": ["diagnose", "--weights", str(tmp_path / "w.safetensors"), *out],
        "inspect --weights": ["inspect", "timm:vit_tiny_patch16_224", "--weights", "w.pt"],
    }
    for name, args in cases.items():
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (name, result.output)
        err = flat(result.stderr)
        assert err.startswith("error:") and "Traceback" not in result.output, (name, err)
    nope = runner.invoke(app, ["fix", "--neurons", "nope.json", "--out", str(tmp_path / "o")])
    assert "no NeuronSet at 'nope.json'" in flat(nope.stderr)
    builtin = runner.invoke(app, ["fix", "--neurons", "builtin", "--out", str(tmp_path / "o")])
    assert "no built-in neuron set for 'planted:dinov2_s14'" in flat(builtin.stderr)


def test_random_init_and_weights_exclude_each_other(tmp_path, no_model):
    weights = tmp_path / "w.safetensors"
    save_file({"x": torch.zeros(1)}, str(weights))
    result = runner.invoke(app, ["diagnose", "--random-init", "--weights", str(weights)])
    assert result.exit_code == 2 and "exclude each other" in flat(result.stderr)


# ----------------------------------------------------------------------------- bugs and help
def test_an_unexpected_error_is_a_bug_report_and_debug_shows_the_traceback(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom inside the library")

    monkeypatch.setattr(vitreg.verbs.VERBS["diagnose"], "run", broken)
    result = runner.invoke(app, ["diagnose"])
    assert result.exit_code == 1
    err = flat(result.stderr)
    assert "this is a bug in vitreg, please report it" in err
    assert "RuntimeError: boom inside the library" in err and "--debug" in err
    assert "Traceback" not in result.output
    debug = runner.invoke(app, ["--debug", "diagnose"])
    assert isinstance(debug.exception, RuntimeError) and debug.exc_info[2] is not None
    assert "this is a bug" not in debug.output


def test_an_input_error_escaping_a_verb_is_still_exit_2(monkeypatch):
    def bad(*args, **kwargs):
        raise InputError("the input is wrong in this way")

    monkeypatch.setattr(vitreg.verbs.VERBS["diagnose"], "run", bad)
    result = runner.invoke(app, ["diagnose"])
    assert result.exit_code == 2 and flat(result.stderr) == "error: the input is wrong in this way"


@pytest.mark.parametrize(
    "verb",
    [
        ["--help"],
        ["diagnose"],
        ["neurons"],
        ["fix"],
        ["probe"],
        ["train"],
        ["inspect"],
        ["compare"],
        ["experiment", "variants"],
    ],
)
def test_help_shows_no_type_on_flags(verb):
    result = runner.invoke(app, [*verb, "--help"] if verb != ["--help"] else verb)
    assert result.exit_code == 0 and "<bool>" not in result.output
    assert "--help" in result.output


def test_every_model_loading_verb_takes_weights_and_device():
    for verb in ("diagnose", "neurons", "fix", "probe", "inspect"):
        text = runner.invoke(app, [verb, "--help"], env={"COLUMNS": "200"}).output
        assert "--weights" in text and "--device" in text, verb
    assert "--device" in runner.invoke(app, ["train", "--help"]).output


# ----------------------------------------------------------------------------- --weights
def test_weights_file_gives_the_numbers_of_the_same_local_folder(tmp_path, monkeypatch):
    torch.manual_seed(1)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32)
    weights = tmp_path / "tuned.safetensors"
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(weights))
    folder = tmp_path / "folder"
    folder.mkdir()
    config = {"architecture": "vit_tiny_patch16_224", "model_args": {"img_size": 32}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(weights.read_bytes())
    images = tmp_path / "images"
    images.mkdir()
    gen = torch.Generator().manual_seed(0)
    for i in range(4):
        pixels = (torch.rand(40, 40, 3, generator=gen) * 255).byte().numpy()
        Image.fromarray(pixels).save(images / f"{i}.png")
    results, configs, docs, consoles = {}, {}, {}, {}

    def keep(out, result, config, **kwargs):  # the numbers, without drawing the figures
        results[out.name] = result.results.model_dump(mode="json")
        configs[out.name] = config.to_file()
        docs[out.name] = diagnose_document(result, config, "vitreg diagnose (test)")

    monkeypatch.setattr(verb_diagnose, "_writer", lambda: keep)
    specs = {
        "file": ["timm:vit_tiny_patch16_224", "--img-size", "32", "--weights", str(weights)],
        "folder": [f"local:{folder}"],
        "random": ["timm:vit_tiny_patch16_224", "--img-size", "32", "--random-init"],
    }
    for name, spec in specs.items():
        args = ["diagnose", *spec, "--images", str(images), "--out", str(tmp_path / "runs" / name)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        consoles[name] = flat(result.stdout)
    assert json.dumps(results["file"]) == json.dumps(results["folder"]) and results["file"]["norms"]
    assert json.dumps(results["file"]) != json.dumps(results["random"])
    assert configs["file"]["weights"] == str(weights) and configs["folder"]["weights"] is None
    # random weights are flagged in the console and first in every report, trained ones not
    assert (
        "RANDOM WEIGHTS: timm:vit_tiny_patch16_224 has random, untrained weights (built with "
        "--random-init)" in (consoles["random"])
    )
    assert "RANDOM WEIGHTS" not in consoles["file"] + consoles["folder"]
    random_md = render_markdown(report(docs["random"]))
    assert random_md.startswith("**RANDOM WEIGHTS:** `timm:vit_tiny_patch16_224` has random")
    assert [docs[n].model.weights for n in specs] == ["user", "user", "random"]
    assert synthetic_banner(docs["random"]) == random_md.splitlines()[0]
    # the attention table says its top-k mass counts a query attending to itself
    assert "top-1 mass (self incl.)" in random_md and "[CLS] attending to itself" in random_md
    assert report(docs["file"]).banner is None and synthetic_banner(docs["file"]) is None
