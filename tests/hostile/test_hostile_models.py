"""Hostile model folders, weights files and neuron sets: each is a named error (InputError or
WeightsError naming the file and the field), never a traceback, and nothing is read from outside
a ``local:`` folder. Everything is generated in tmp_path with tiny timm models."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
import timm
import torch
from pydantic import BaseModel
from safetensors.torch import save_file
from typer.testing import CliRunner

import vitreg
from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app
from vitreg.errors import InputError, SpecError, WeightsError
from vitreg.fix.neuron_set import FORMAT
from vitreg.models.loaders.local import save_local
from vitreg.neurons import NeuronSet

ARCH = "vit_tiny_patch16_224"
ARGS = {"depth": 1, "img_size": 32}
runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def tiny(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(ARCH, pretrained=False, **{**ARGS, **kwargs}).eval()


def save_weights(module: torch.nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path))
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A valid local: folder (tiny ViT, depth 1, 32 px); tests then make it hostile."""
    return save_local(tiny(), tmp_path / "m", **ARGS)


def config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def write_config(folder: Path, cfg: object) -> None:
    (folder / "config.json").write_text(json.dumps(cfg))


class Marker:
    """Unpickling this creates a file: proof that a pickle was (not) executed."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def pickle_file(path: Path, marker: Path) -> Path:
    torch.save({"weight": torch.zeros(1), "evil": Marker(marker)}, path)
    return path


def diagnose(folder: Path, *extra: str):
    return runner.invoke(app, ["diagnose", f"local:{folder}", "--img-size", "32", *extra])


# -- config.json: every wrong field is an InputError naming the file and the field -------------

HOSTILE_CONFIGS = {
    "architecture_number": ({"architecture": 5}, "architecture"),
    "architecture_list": ({"architecture": [ARCH]}, "architecture"),
    "architecture_unknown": ({"architecture": "vit_nonexistent_xyz"}, "architecture"),
    "model_args_list": ({"architecture": ARCH, "model_args": [1, 2]}, "model_args"),
    "model_args_dict_value": (
        {"architecture": ARCH, "model_args": {"depth": {"n": 1}}},
        "model_args",
    ),
    "unknown_kwarg": (
        {"architecture": ARCH, "model_args": {**ARGS, "frobnicate": 3}},
        "model_args.frobnicate",
    ),
    "depth_string": ({"architecture": ARCH, "model_args": {"depth": "12"}}, "depth"),
    "depth_float": ({"architecture": ARCH, "model_args": {"depth": 2.5}}, "depth"),
    "img_size_huge": ({"architecture": ARCH, "model_args": {"img_size": 100000}}, "img_size"),
    "pretrained_cfg_list": (
        {"architecture": ARCH, "model_args": ARGS, "pretrained_cfg": [1]},
        "pretrained_cfg",
    ),
    "mean_strings": (
        {"architecture": ARCH, "model_args": ARGS, "pretrained_cfg": {"mean": ["a", "b", "c"]}},
        "pretrained_cfg.mean",
    ),
    "std_zero": (
        {"architecture": ARCH, "model_args": ARGS, "pretrained_cfg": {"std": [0, 1, 1]}},
        "pretrained_cfg.std",
    ),
    "config_null": (None, "holds null"),
    "config_string": ("vit", "holds a str"),
    "config_list": ([ARCH], "holds a list"),
    "no_architecture": ({"model_args": ARGS}, "architecture: missing"),
    "checkpoint_path": (
        {"architecture": ARCH, "model_args": {**ARGS, "checkpoint_path": "/etc/passwd"}},
        "checkpoint_path",
    ),
    "overlay_file": (
        {
            "architecture": ARCH,
            "model_args": {**ARGS, "pretrained_cfg_overlay": {"file": "/tmp/x.pth"}},
        },
        "pretrained_cfg_overlay",
    ),
    "pretrained_kwarg": (
        {"architecture": ARCH, "model_args": {**ARGS, "pretrained": True}},
        "pretrained",
    ),
    "fix_section_list": (
        {"architecture": ARCH, "model_args": ARGS, "vitreg_fix": ["neurons"]},
        "vitreg_fix",
    ),
    "fix_options_string": (
        {
            "architecture": ARCH,
            "model_args": ARGS,
            "vitreg_fix": {
                "method": "test_time_registers",
                "neurons": "neurons",
                "n_neurons": 1,
                "options": {"n_registers": "2"},
            },
        },
        "vitreg_fix.options.n_registers",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CONFIGS))
def test_hostile_config_is_a_named_input_error(folder: Path, case: str) -> None:
    cfg, field = HOSTILE_CONFIGS[case]
    write_config(folder, cfg)
    with pytest.raises(InputError) as err:
        vitreg.load(f"local:{folder}", pretrained=False)
    message = str(err.value)
    assert "config.json" in message and field in message, message
    assert "\n" not in message


@pytest.mark.parametrize("case", ["architecture_list", "mean_strings", "checkpoint_path"])
def test_hostile_config_on_the_cli_is_one_paragraph(folder: Path, case: str) -> None:
    cfg, field = HOSTILE_CONFIGS[case]
    write_config(folder, cfg)
    assert_clean_failure(diagnose(folder), "config.json", field)
    assert_clean_failure(diagnose(folder, "--random-init"), "config.json", field)


def test_duplicate_keys_are_refused(folder: Path) -> None:
    text = '{"architecture": "%s", "model_args": {"depth": 1, "depth": 40, "img_size": 32}}'
    (folder / "config.json").write_text(text % ARCH)
    with pytest.raises(InputError, match="'depth' twice"):
        vitreg.load(f"local:{folder}")
    (folder / "config.json").write_text(f'{{"architecture": "{ARCH}", "architecture": "x"}}')
    assert_clean_failure(diagnose(folder), "config.json", "'architecture' twice")


def test_not_json_and_nan_are_refused(folder: Path) -> None:
    (folder / "config.json").write_text('{"architecture": ')
    with pytest.raises(InputError, match="not valid JSON"):
        vitreg.load(f"local:{folder}")
    (folder / "config.json").write_text(
        f'{{"architecture": "{ARCH}", "model_args": {{"depth": 1, "mlp_ratio": NaN}}}}'
    )
    with pytest.raises(InputError, match="NaN"):
        vitreg.load(f"local:{folder}")
    (folder / "config.json").write_bytes(b'{"architecture": "\xff"}')
    with pytest.raises(InputError, match="UTF-8"):
        vitreg.load(f"local:{folder}")


@contextmanager
def only_meta_builds():
    """Record the default device of every ``timm.create_model`` call; fail on a real build."""
    devices: list[str] = []
    real = timm.create_model

    def spy(*args, **kwargs):
        devices.append(torch.get_default_device().type)
        assert devices[-1] == "meta", "a model was built on a real device before the size check"
        return real(*args, **kwargs)

    with mock.patch.object(timm, "create_model", spy):
        yield devices


def test_sizes_that_ask_for_too_much_memory_are_refused_before_building(folder: Path) -> None:
    # ~77 billion parameters (300 GB): refused from the config alone
    write_config(
        folder,
        {"architecture": ARCH, "model_args": {"depth": 24, "embed_dim": 16384, "num_heads": 16}},
    )
    with pytest.raises(InputError, match="billion parameters") as err:
        with only_meta_builds() as devices:
            vitreg.load(f"local:{folder}", pretrained=False)
    assert "config.json" in str(err.value) and devices == []  # from the config alone
    # the architecture's own width with a 64x MLP (about 40 GB of float32): estimated on the
    # meta device, where nothing is allocated
    huge = {"architecture": "vit_huge_patch14_224", "model_args": {"depth": 48, "mlp_ratio": 64}}
    write_config(folder, huge)
    with pytest.raises(InputError, match="billion parameters"):
        with only_meta_builds() as devices:
            vitreg.load(f"local:{folder}", pretrained=False)
    assert devices == ["meta"]
    # a size whose attention maps alone need > 16 GiB per image
    write_config(folder, {"architecture": ARCH, "model_args": {"depth": 1, "img_size": 4096}})
    with pytest.raises(InputError, match="tokens per image"):
        vitreg.load(f"local:{folder}", pretrained=False)


def test_unknown_kwarg_from_the_caller_stays_a_type_error(folder: Path) -> None:
    with pytest.raises(TypeError, match="frobnicate"):
        vitreg.load(f"local:{folder}", pretrained=False, frobnicate=1)


def test_local_file_is_not_a_folder(folder: Path) -> None:
    weights = folder / "model.safetensors"
    with pytest.raises(SpecError, match="is a file, not a folder: local: takes a folder"):
        vitreg.load(f"local:{weights}")
    with pytest.raises(SpecError, match="does not exist"):
        vitreg.load(f"local:{folder / 'nope'}")


# -- containment: nothing outside the folder is read -------------------------------------------


def test_checkpoint_path_is_refused_and_never_read(folder: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = pickle_file(tmp_path / "outside.pth", marker)
    cfg = config(folder)
    cfg["model_args"]["checkpoint_path"] = str(evil)
    write_config(folder, cfg)
    for pretrained in (True, False):
        with pytest.raises(InputError, match="checkpoint_path"):
            vitreg.load(f"local:{folder}", pretrained=pretrained)
    assert not marker.exists()


def test_weights_symlink_out_of_the_folder_is_refused(folder: Path, tmp_path: Path) -> None:
    outside = save_weights(tiny(), tmp_path / "outside.safetensors")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside)
    with pytest.raises(InputError, match="outside the folder") as err:
        vitreg.load(f"local:{folder}")
    assert "model.safetensors" in str(err.value)
    assert_clean_failure(diagnose(folder), "outside the folder", "model.safetensors")


def test_config_symlink_out_of_the_folder_is_refused(folder: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text((folder / "config.json").read_text())
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(outside)
    with pytest.raises(InputError, match="outside the folder"):
        vitreg.load(f"local:{folder}")


def test_a_symlink_inside_the_folder_is_fine(folder: Path) -> None:
    (folder / "real.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("real.safetensors")
    vitreg.load(f"local:{folder}")


def fix_section(neurons: str, n: int = 1) -> dict:
    return {"method": "test_time_registers", "neurons": neurons, "n_neurons": n, "options": {}}


def test_fix_neuron_path_stays_inside_the_folder(folder: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    NeuronSet([0], [5], [1.0]).save(outside / "neurons")
    cases = {
        "../elsewhere/neurons": "'..'",
        str(outside / "neurons"): "absolute path",
        "~/neurons": "absolute path",
    }
    for path, needle in cases.items():
        cfg = config(folder)
        cfg["vitreg_fix"] = fix_section(path)
        write_config(folder, cfg)
        with pytest.raises(InputError, match=needle) as err:
            vitreg.load(f"local:{folder}")
        assert "vitreg_fix.neurons" in str(err.value) and "config.json" in str(err.value)
    # a symlink to a set outside: each of the two files is checked
    (folder / "neurons.json").symlink_to(outside / "neurons.json")
    (folder / "neurons.safetensors").symlink_to(outside / "neurons.safetensors")
    cfg = config(folder)
    cfg["vitreg_fix"] = fix_section("neurons")
    write_config(folder, cfg)
    with pytest.raises(InputError, match="outside the folder"):
        vitreg.load(f"local:{folder}")
    assert_clean_failure(diagnose(folder), "vitreg_fix.neurons", "outside the folder")
    # the same set copied into the folder is applied
    for name in ("neurons.json", "neurons.safetensors"):
        (folder / name).unlink()
        (folder / name).write_bytes((outside / name).read_bytes())
    model = vitreg.load(f"local:{folder}")
    assert model.layout.n_extra == 1


def test_saved_fix_with_bad_neurons_fails_at_load(folder: Path) -> None:
    cfg = config(folder)
    cfg["vitreg_fix"] = fix_section("neurons")
    write_config(folder, cfg)
    NeuronSet([3], [5], [1.0]).save(folder / "neurons")  # block 3 of a 1-block model
    with pytest.raises(InputError, match="outside the model"):
        vitreg.load(f"local:{folder}")
    NeuronSet([0, 0], [5, 6], [1.0, 0.5]).save(folder / "neurons")  # n_neurons says 1
    with pytest.raises(InputError, match="n_neurons"):
        vitreg.load(f"local:{folder}")


def test_random_init_reads_no_weights_file(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitreg.verbs.loading import load_spec as _load

    (folder / "model.safetensors").write_bytes(b"not weights at all")

    def refuse(*args, **kwargs):
        raise AssertionError("a weights file was read")

    import safetensors.torch

    from vitreg.models import load as load_module
    from vitreg.models.loaders import timm_source

    monkeypatch.setattr(load_module, "read_state_dict", refuse)
    monkeypatch.setattr(timm_source, "read_state_dict", refuse)
    monkeypatch.setattr(safetensors.torch, "load_file", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    model = vitreg.load(f"local:{folder}", pretrained=False)
    assert model.n_layers == 1
    assert _load(f"local:{folder}", False, None, 32).n_layers == 1  # the CLI's --random-init


def test_pickled_weights_are_one_paragraph_and_never_run(folder: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (folder / "model.safetensors").unlink()
    pickle_file(folder / "pytorch_model.bin", marker)
    with pytest.raises(WeightsError, match="pickled Python objects") as err:
        vitreg.load(f"local:{folder}")
    assert "pytorch_model.bin" in str(err.value) and "\n" not in str(err.value)
    assert_clean_failure(diagnose(folder), "pytorch_model.bin", "pickled")
    # weights= goes through the same reader (timm's own file loading would unpickle it)
    evil = pickle_file(tmp_path / "evil.pth", marker)
    with pytest.raises(WeightsError, match="pickled"):
        vitreg.load(f"timm:{ARCH}", pretrained=False, weights=evil, **ARGS)
    assert not marker.exists()


# -- strict weights -----------------------------------------------------------------------------


def test_a_512_class_head_loads_exactly_or_says_num_classes(tmp_path: Path) -> None:
    arch = "vit_base_patch16_clip_224"
    torch.manual_seed(0)
    source = timm.create_model(arch, pretrained=False, num_classes=512, **ARGS).eval()
    path = save_weights(source, tmp_path / "clip512.safetensors")
    x = torch.randn(2, 3, 32, 32)
    model = vitreg.load(f"timm:{arch}", pretrained=False, weights=path, num_classes=512, **ARGS)
    with torch.no_grad():
        assert torch.allclose(model.module(x), source(x), atol=1e-6)
    assert torch.equal(model.module.head.weight, source.head.weight)
    with pytest.raises(WeightsError, match="pass num_classes=512") as err:
        vitreg.load(f"timm:{arch}", pretrained=False, weights=path, **ARGS)
    assert "512-class head" in str(err.value) and "clip512.safetensors" in str(err.value)
    with pytest.raises(WeightsError, match="pass num_classes=512"):
        vitreg.load(f"timm:{arch}", pretrained=False, weights=path, num_classes=0, **ARGS)
    # a torch state dict (read with weights_only=True) loads the same way
    pt = tmp_path / "clip512.pth"
    torch.save(source.state_dict(), pt)
    again = vitreg.load(f"timm:{arch}", weights=pt, num_classes=512, **ARGS)
    assert torch.equal(again.module.head.bias, source.head.bias)


def test_weights_missing_keys_are_named(tmp_path: Path) -> None:
    state = {k: v for k, v in tiny().state_dict().items() if not k.startswith("blocks.0.mlp")}
    path = tmp_path / "partial.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    with pytest.raises(WeightsError, match="blocks.0.mlp.fc1") as err:
        vitreg.load(f"timm:{ARCH}", weights=path, **ARGS)
    assert "partial.safetensors" in str(err.value) and "4 keys of the model" in str(err.value)


def test_local_head_mismatch_names_the_config_field(folder: Path) -> None:
    save_weights(tiny(num_classes=512), folder / "model.safetensors")
    with pytest.raises(WeightsError, match="set model_args.num_classes to 512") as err:
        vitreg.load(f"local:{folder}")
    assert "config.json" in str(err.value) and "model.safetensors" in str(err.value)
    cfg = config(folder)
    cfg["model_args"]["num_classes"] = 512
    write_config(folder, cfg)
    model = vitreg.load(f"local:{folder}")
    assert model.module.head.weight.shape == (512, 192)


# -- neuron sets --------------------------------------------------------------------------------


def test_dotted_neuron_file_names_keep_their_stem(tmp_path: Path) -> None:
    ns = NeuronSet([0, 1], [5, 9], [2.0, 1.0])
    path = ns.save(tmp_path / "set.v1.json")
    assert path == tmp_path / "set.v1.json"
    assert (tmp_path / "set.v1.safetensors").is_file() and not (tmp_path / "set.json").exists()
    for name in ("set.v1.json", "set.v1.safetensors", "set.v1"):
        assert NeuronSet.load(tmp_path / name).pairs() == ns.pairs()
    ns.save(tmp_path / "plain")
    assert (tmp_path / "plain.json").is_file() and (tmp_path / "plain.safetensors").is_file()


def test_a_neuron_set_is_its_files_model_and_to_dict_warns(tmp_path: Path) -> None:
    ns = NeuronSet([0, 1], [5, 9], [2.0, 1.0], "timm:x", settings={"top_k": 2})
    path = ns.save(tmp_path / "set")
    written = json.loads(path.read_text())
    assert isinstance(ns, BaseModel) and written == ns.model_dump()
    assert list(written) == [*NeuronSet.model_fields] and written["format"] == FORMAT
    assert written["neurons"][1] == {"layer": 1, "unit": 9, "score": 1.0}
    back = NeuronSet.load(path)
    assert back == ns and (back.layers, back.units, back.scores) == ([0, 1], [5, 9], [2.0, 1.0])
    with pytest.warns(DeprecationWarning, match="model_dump"):
        assert ns.to_dict() == written
    with pytest.raises(InputError, match="as many layers as units"):
        NeuronSet([0, 1], [5], [1.0])


def neuron_json(**changes) -> dict:
    meta = NeuronSet(
        [0, 1], [5, 9], [2.0, 1.0], "timm:x", "vit", 2, 768, None, {"detect_layer": 1}
    ).model_dump()
    meta.update(changes)
    return meta


HOSTILE_SETS = {
    "layer_string": (
        neuron_json(neurons=[{"layer": "0", "unit": 5, "score": 1.0}]),
        "neurons.0.layer",
    ),
    "unit_negative": (
        neuron_json(neurons=[{"layer": 0, "unit": -1, "score": 1.0}]),
        "neurons.0.unit",
    ),
    "unit_missing": (neuron_json(neurons=[{"layer": 0, "score": 1.0}]), "neurons.0.unit: missing"),
    "score_nan": (
        neuron_json(neurons=[{"layer": 0, "unit": 1, "score": float("nan")}]),
        "neurons.0.score",
    ),
    "neurons_missing": ({"format": "vitreg.neuron_set/1"}, "neurons: missing"),
    "neurons_dict": (neuron_json(neurons={"0": 5}), "neurons"),
    "settings_string": (neuron_json(settings="fast"), "settings"),
    "threshold_string": (neuron_json(settings={"threshold": "150"}), "settings.threshold"),
    "threshold_negative": (neuron_json(settings={"threshold": -5}), "settings.threshold"),
    "threshold_value_zero": (
        neuron_json(settings={"threshold": "absolute", "threshold_value": 0}),
        "settings.threshold_value",
    ),
    "absolute_without_value": (neuron_json(settings={"threshold": "absolute"}), "threshold_value"),
    "detect_layer_string": (neuron_json(settings={"detect_layer": "1"}), "settings.detect_layer"),
    "n_layers_zero": (neuron_json(n_layers=0), "n_layers"),
    "d_mlp_float": (neuron_json(d_mlp=768.0), "d_mlp"),
    "format_missing": ({"neurons": []}, "not a vitreg NeuronSet"),
    "not_an_object": ([1, 2, 3], "not a vitreg NeuronSet"),
    "unknown_key": (neuron_json(extra_field=1), "extra_field"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SETS))
def test_hostile_neuron_json_is_a_named_input_error(tmp_path: Path, case: str) -> None:
    meta, field = HOSTILE_SETS[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(meta))
    with pytest.raises(InputError) as err:
        NeuronSet.load(path)
    message = str(err.value)
    assert "bad.json" in message and field in message, message


def test_numeric_threshold_is_the_absolute_rule(tmp_path: Path) -> None:
    path = tmp_path / "n.json"
    path.write_text(json.dumps(neuron_json(settings={"threshold": 150})))
    ns = NeuronSet.load(path)
    assert ns.settings["threshold"] == "absolute" and ns.settings["threshold_value"] == 150.0


def test_duplicate_key_in_a_neuron_set_is_refused(tmp_path: Path) -> None:
    path = NeuronSet([0], [5], [1.0]).save(tmp_path / "n")
    text = path.read_text().replace('"format"', '"fingerprint": "a", "format"', 1)
    path.write_text(text.replace('"fingerprint": null', '"fingerprint": "b"'))
    with pytest.raises(InputError, match="'fingerprint' twice"):
        NeuronSet.load(path)


TENSOR_CASES = {
    "units_2d": (
        {"units": torch.tensor([[5, 9]])},
        "units is a 2-D",
    ),
    "units_float": ({"units": torch.tensor([5.0, 9.0])}, "1-D int64"),
    "layers_int32": ({"layers": torch.tensor([0, 1], dtype=torch.int32)}, "1-D int64"),
    "scores_int": ({"scores": torch.tensor([2, 1])}, "1-D float"),
    "lengths": ({"scores": torch.tensor([2.0, 1.0, 0.5], dtype=torch.float64)}, "3 scores"),
    "other_units": ({"units": torch.tensor([5, 10])}, "do not match"),
    "extra_key": ({"evil": torch.zeros(1)}, "expected exactly"),
}


@pytest.mark.parametrize("case", sorted(TENSOR_CASES))
def test_hostile_neuron_tensors_are_named(tmp_path: Path, case: str) -> None:
    path = NeuronSet([0, 1], [5, 9], [2.0, 1.0]).save(tmp_path / "n")
    tensors = {
        "layers": torch.tensor([0, 1]),
        "units": torch.tensor([5, 9]),
        "scores": torch.tensor([2.0, 1.0], dtype=torch.float64),
    }
    change, needle = TENSOR_CASES[case]
    save_file({**tensors, **change}, str(tmp_path / "n.safetensors"))
    with pytest.raises(InputError, match=needle) as err:
        NeuronSet.load(path)
    assert "n.safetensors" in str(err.value)
    (tmp_path / "n.safetensors").write_bytes(b"garbage")
    with pytest.raises(InputError, match="cannot be read"):
        NeuronSet.load(path)


@pytest.fixture(scope="module")
def two_blocks():
    return vitreg.wrap(tiny(depth=2), spec="timm:tiny2")


def test_check_applicable(two_blocks) -> None:
    model = two_blocks  # 2 blocks, d_mlp 768
    NeuronSet([0, 1], [5, 9], [2.0, 1.0], settings={"detect_layer": 1}).check_applicable(model)
    empty = NeuronSet([], [], [])
    assert len(empty) == 0  # a valid object, a no-op fix ...
    with pytest.raises(InputError, match="names no neurons"):  # ... but nothing to fix with
        empty.check_applicable(model)
    cases = [
        (NeuronSet([0], [5], [1.0], settings={"detect_layer": 22}), "settings.detect_layer"),
        (NeuronSet([0], [5], [1.0], settings={"highest_layer": 2}), "settings.highest_layer"),
        (NeuronSet([0], [5], [1.0], settings={"top_k": 10**6}), "settings.top_k"),
        (NeuronSet([5], [5], [1.0]), "outside the model"),
        (NeuronSet([0], [768], [1.0]), "outside the model"),
        (NeuronSet([0, 0], [5, 5], [1.0, 1.0]), "more than once"),
        (NeuronSet([0] * 768, list(range(768)), [1.0] * 768), "768 of the 768 MLP units"),
        (NeuronSet([0], [5], [1.0], n_layers=24, d_mlp=4096), "made for"),
    ]
    for ns, needle in cases:
        with pytest.raises(InputError, match=needle):
            ns.check_applicable(model)


BAD_FOR_PLANTED = {
    "json": (neuron_json(neurons=[{"layer": 0, "unit": "five", "score": 1.0}]), "neurons.0.unit"),
    "detect_layer": (
        NeuronSet([0], [5], [1.0], settings={"detect_layer": 40}).model_dump(),
        "settings.detect_layer",
    ),
    "empty": (NeuronSet([], [], []).model_dump(), "names no neurons"),
    "every_unit": (
        NeuronSet([0] * 1536, list(range(1536)), [1.0] * 1536).model_dump(),
        "1536 of the 1536",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FOR_PLANTED))
def test_fix_refuses_bad_sets_before_computing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli_models: dict, case: str
) -> None:
    from vitreg.models.model import Model
    from vitreg.verbs import fix as fix_verb

    def computed(*args, **kwargs):
        raise AssertionError("the model computed before the neuron set was checked")

    for name in ("__call__", "run_batches", "trace", "run_with_cache"):
        monkeypatch.setattr(Model, name, computed)
    monkeypatch.setattr(fix_verb, "compare", computed)
    meta, needle = BAD_FOR_PLANTED[case]
    bad = tmp_path / "BAD.json"
    bad.write_text(json.dumps(meta))
    out = tmp_path / "run"
    args = ["fix", "planted:dinov2_s14", "--img-size", "112", "--neurons", str(bad)]
    result = runner.invoke(app, [*args, "--limit", "4", "--out", str(out)])
    assert_clean_failure(result, needle)
    assert not (out / "metrics.json").exists()


def test_weights_folder_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="is a folder, not a file"):
        vitreg.load(f"timm:{ARCH}", weights=tmp_path, **ARGS)
    assert os.path.isdir(tmp_path)


def test_hugging_face_folder_stays_inside_and_is_typed(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": 5}))
    with pytest.raises(InputError, match="model_type"):
        vitreg.load(f"local:{hf}", pretrained=False)
    (hf / "config.json").write_text(json.dumps({"model_type": "dinov2"}))
    outside = save_weights(tiny(), tmp_path / "outside.safetensors")
    (hf / "model.safetensors").symlink_to(outside)
    with pytest.raises(InputError, match="outside the folder"):
        vitreg.load(f"local:{hf}")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_weights_name_the_file_and_the_tensor(folder: Path, value: float) -> None:
    state = {k: v.clone() for k, v in tiny().state_dict().items()}
    state["blocks.0.mlp.fc1.weight"][3, 5] = value
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match="NaN or infinite values in 1 tensors") as err:
        vitreg.load(f"local:{folder}")
    assert "blocks.0.mlp.fc1.weight" in str(err.value) and "model.safetensors" in str(err.value)
    assert_clean_failure(diagnose(folder), "model.safetensors", "blocks.0.mlp.fc1.weight")
    with pytest.raises(WeightsError, match="blocks.0.mlp.fc1.weight"):  # --weights: same check
        vitreg.load(f"timm:{ARCH}", weights=folder / "model.safetensors", **ARGS)


def test_save_onto_a_file_is_refused_before_loading(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    for target, needle in ((taken, "is a file"), (taken / "inside", "lies inside")):
        args = ["fix", "planted:dinov2_s14", "--save", str(target), "--out", str(tmp_path / "r")]
        assert_clean_failure(runner.invoke(app, args), "--save", needle, "pass a new folder")
    assert taken.read_text() == "not a folder" and not (tmp_path / "r").exists()
