"""Loading specs, local weights and every bad input the foundation promises a clear error for."""

import json

import pytest
import torch
from safetensors.torch import save_file

import vitreg
from conftest import images
from vitreg import InputError, SpecError, UnsupportedModelError, WeightsError
from vitreg.models.loaders.local import save_local
from vitreg.testing.tiny import timm_vit

SMALL = dict(pretrained=False, depth=2, img_size=56)


def test_timm_spec_builds_the_architecture_and_transform():
    m = vitreg.load("timm:vit_small_patch14_reg4_dinov2", **SMALL)
    assert m.family == "timm-vit" and m.layout.n_reg == 4 and m.layout.grid == (4, 4)
    assert (m.n_layers, m.d_model, m.d_mlp, m.n_heads) == (2, 384, 1536, 6)
    assert m.adapter.data_config()["input_size"] == (3, 56, 56)  # not the 518 of pretrained_cfg
    from PIL import Image

    t = m.transform(Image.new("RGB", (80, 60), (10, 200, 30)))
    assert t.shape == (3, 56, 56)
    assert m.describe().layout["n_tokens"] == 21


@pytest.mark.parametrize(
    "spec,match",
    [
        ("vit_small_patch14_dinov2", "source prefix"),
        ("nope:vit_small", "unknown model source"),
        ("timm:", "names no model"),
        ("timm:vit_smal_patch14_dinov2", "did you mean"),
        ("timm:vit_small_patch14_dinov2.not_a_tag", "lvd142m"),
    ],
)
def test_bad_specs_raise_spec_error(spec, match):
    with pytest.raises(SpecError, match=match):
        vitreg.load(spec, pretrained=False)


def test_offline_pretrained_names_the_fix():
    with pytest.raises(WeightsError) as err:
        vitreg.load("timm:vit_small_patch14_dinov2.lvd142m", pretrained=True, img_size=56)
    msg = str(err.value)
    for needle in (
        "timm/vit_small_patch14_dinov2.lvd142m",
        "offline",
        "HF_HUB_OFFLINE",
        "weights=",
        "local:",
    ):
        assert needle in msg


def test_traps_are_reported_as_notes():
    with pytest.warns(UserWarning, match="518"):
        m = vitreg.load("timm:vit_small_patch14_dinov2", pretrained=False, depth=1)
    assert any("518" in n for n in m.notes)
    with pytest.warns(UserWarning, match="quickgelu"):
        vitreg.load(
            "timm:vit_base_patch16_clip_224.openai", weights=None, pretrained=False, depth=1
        )


def test_weights_file_roundtrip_safetensors_and_torch(tmp_path):
    module, size = timm_vit("dinov2")
    x = images(1, size)
    ref = module.forward_features(x)
    st = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(st))
    pt = tmp_path / "w.pth"
    torch.save(module.state_dict(), pt)
    for path in (st, pt):
        m = vitreg.load("timm:vit_small_patch14_dinov2", weights=path, depth=3, img_size=56)
        assert torch.allclose(m.features(x), ref, atol=1e-6)


def test_weights_errors(tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        vitreg.load(
            "timm:vit_small_patch14_dinov2", weights=tmp_path / "missing.safetensors", **SMALL
        )
    bad = tmp_path / "w.ckpt"
    bad.write_bytes(b"x")
    with pytest.raises(WeightsError, match="suffix"):
        vitreg.load("timm:vit_small_patch14_dinov2", weights=bad, **SMALL)
    corrupt = tmp_path / "w.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    with pytest.raises(WeightsError, match="corrupt"):
        vitreg.load("timm:vit_small_patch14_dinov2", weights=corrupt, depth=2, img_size=56)


def test_pickled_code_is_never_executed(tmp_path):
    class Evil:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pwned')",))

    path = tmp_path / "evil.pth"
    torch.save({"a": Evil()}, path)
    from vitreg.models.load import read_state_dict

    with pytest.raises(WeightsError):
        read_state_dict(path)


def test_local_dir_roundtrip_and_errors(tmp_path):
    module, size = timm_vit("dinov2_reg4")
    x = images(1, size)
    save_local(module, tmp_path / "m", depth=3, img_size=56)
    m = vitreg.load(f"local:{tmp_path / 'm'}")
    assert torch.allclose(m.features(x), module.forward_features(x), atol=1e-6)
    assert m.layout.n_reg == 4
    with pytest.raises(SpecError, match="does not exist"):
        vitreg.load(f"local:{tmp_path / 'nope'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="config.json"):
        vitreg.load(f"local:{tmp_path / 'empty'}")
    (tmp_path / "empty" / "config.json").write_text(
        json.dumps(
            {"architecture": "vit_small_patch14_dinov2", "model_args": {"img_size": 56, "depth": 3}}
        )
    )
    with pytest.raises(WeightsError, match="no weights file"):
        vitreg.load(f"local:{tmp_path / 'empty'}")
    (tmp_path / "empty" / "config.json").write_text(
        json.dumps(
            {"architecture": "vit_small_patch14_dinov2", "model_args": {"img_size": 56, "depth": 2}}
        )
    )
    save_file(
        {k: v.contiguous() for k, v in module.state_dict().items()},
        str(tmp_path / "empty" / "model.safetensors"),
    )
    with pytest.raises(WeightsError, match="do not fit"):
        vitreg.load(f"local:{tmp_path / 'empty'}")


def test_bad_images_raise_input_error():
    m = vitreg.load("timm:vit_small_patch14_dinov2", **SMALL)
    with pytest.raises(InputError, match="img_size"):
        m.features(images(1, 64))
    with pytest.raises(InputError, match="RGB"):
        m.features(torch.zeros(1, 1, 56, 56))
    with pytest.raises(InputError, match="RGB"):
        m.features(torch.zeros(1, 4, 56, 56))
    with pytest.raises(InputError, match="batch dimension"):
        m.features(torch.zeros(3, 56, 56))
    with pytest.raises(InputError, match="float"):
        m.features(torch.zeros(1, 3, 56, 56, dtype=torch.uint8))
    with pytest.raises(InputError, match="transform"):
        m.features([[0.0]])
    dyn = vitreg.load(
        "timm:vit_small_patch14_dinov2", pretrained=False, depth=1, dynamic_img_size=True
    )
    assert dyn.features(images(1, 70)).shape[1] == 26
    with pytest.raises(InputError, match="multiple of the patch size"):
        dyn.features(images(1, 60))


def test_unknown_family_is_rejected():
    with pytest.raises(UnsupportedModelError, match="supported families"):
        vitreg.wrap(torch.nn.Linear(3, 3))


def test_preprocess_requires_rgb_pil_images():
    from PIL import Image

    m = vitreg.load("timm:vit_small_patch14_dinov2", **SMALL)
    batch = m.preprocess([Image.new("RGB", (64, 64)), Image.new("RGB", (70, 50))])
    assert batch.shape == (2, 3, 56, 56)
    for mode in ("L", "RGBA", "CMYK"):
        with pytest.raises(InputError, match="convert\\('RGB'\\)"):
            m.preprocess(Image.new(mode, (64, 64)))
    with pytest.raises(InputError, match="PIL"):
        m.preprocess(torch.zeros(3, 8, 8))
