"""Test-time registers on every plain-ViT family: the edit lands, outputs keep their shape, and
batches equal single images (HF DINOv2/CLIP, open_clip, timm Eva/DINOv3, timm ViT)."""

import pytest
import torch

import vitreg
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.testing.tiny import eva_model, hf_tiny, open_clip_tower


def family_model(key):
    if key.startswith("hf_"):
        m = vitreg.wrap(hf_tiny(key[3:]))
        size = m.adapter.default_image_size()
    elif key.startswith("open_clip_"):
        m = vitreg.wrap(open_clip_tower(key[10:]))
        size = m.adapter.default_image_size()
    else:
        m, x = eva_model(key)
        size = tuple(x.shape[-2:])
    x = torch.randn(4, 3, *size, generator=torch.Generator().manual_seed(5))
    return m, x


@pytest.mark.parametrize(
    "key",
    [
        "hf_dinov2",
        "hf_dinov2_reg",
        "hf_clip",
        "open_clip_gelu",
        "open_clip_quickgelu",
        "dinov3",
        "eva02_tiny",
    ],
)
def test_register_takes_the_max_and_outputs_stay_clean(key):
    model, x = family_model(key)
    units = [1, 3]
    neurons = NeuronSet([0, 0, 1], [1, 3, 2], [3.0, 2.0, 1.0])
    bare = model.features(x)
    with model.insert_tokens(1):  # the register alone, before any edit
        _, unedited = model.run_with_cache(x, names=["blocks.0.mlp.hook_post"])
    peak = unedited["blocks.0.mlp.hook_post"][:, :, units].amax(dim=1)
    with TestTimeRegisters(neurons).applied(model):
        _, cache = model.run_with_cache(x, names=["blocks.0.mlp.hook_post"])
        lay = cache.layout("blocks.0.mlp.hook_post")
        acts = cache["blocks.0.mlp.hook_post"]
        assert lay.n_extra == 1
        # register slot holds each neuron's max over all tokens; every other token holds 0
        assert torch.allclose(acts[:, lay.extra.start, units], peak, atol=1e-5)
        others = torch.cat([acts[:, : lay.extra.start], acts[:, lay.extra.stop :]], dim=1)
        assert others[:, :, units].abs().max() == 0
        fixed = model.features(x)
        single = torch.cat([model.features(x[i : i + 1]) for i in range(4)])
        out = model(x)
    assert fixed.shape == bare.shape  # registers never reach returned tokens
    assert (fixed - single).abs().max() <= 1e-5
    assert out is not None
    assert model.layout.n_extra == 0 and torch.equal(model.features(x), bare)
