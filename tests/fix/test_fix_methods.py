"""The fix registry: names, entries, composition rules and a composed fix that applies its parts
in order and removes them all."""

import pytest
import torch

import vitreg
from vitreg.errors import InputError
from vitreg.fix.methods import FIXES, FixInputs, parse_entries
from vitreg.fix.neuron_set import NeuronSet
from vitreg.results.fix import ComposedDescription, LastBlockDescription, TtrDescription


def test_the_family_is_registered_and_entries_parse():
    assert {"ttr", "attention-bias", "ablate", "clearclip", "sclip", "naclip"} <= set(FIXES)
    assert parse_entries(" ttr, naclip ,ttr+naclip,ttr") == ["ttr", "naclip", "ttr+naclip"]
    with pytest.raises(InputError, match="unknown fix method 'nope'"):
        parse_entries("ttr,nope")
    with pytest.raises(InputError, match="at most one"):
        parse_entries("sclip+naclip")
    with pytest.raises(InputError, match="last"):
        parse_entries("naclip+ttr")
    with pytest.raises(InputError, match="no fix method"):
        parse_entries(" , ")


def test_ttr_plus_naclip_applies_both_and_removes_both():
    torch.manual_seed(0)
    m = vitreg.load(
        "timm:vit_base_patch16_clip_quickgelu_224",
        pretrained=False, depth=2, embed_dim=32, num_heads=2, img_size=32,
    )  # fmt: skip
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    neurons = NeuronSet([0], [3], [1.0])
    with pytest.raises(InputError, match="pass a neuron set"):
        FIXES.build("ttr+naclip", FixInputs(m))
    fix = FIXES.build("ttr+naclip", FixInputs(m, neurons))
    described = fix.describe()
    assert isinstance(described, ComposedDescription)
    assert [p.name for p in described.parts] == ["ttr", "naclip"]
    assert [type(p) for p in described.parts] == [TtrDescription, LastBlockDescription]
    bare = m.features(x)
    naclip_only = FIXES.build("naclip", FixInputs(m))
    with torch.no_grad():
        with naclip_only.applied(m):
            alone = m.features(x)
        with fix.applied(m):
            assert m.layout.n_extra == 1  # the register is in
            both = m.features(x)
    assert m.layout.n_extra == 0 and torch.equal(m.features(x), bare)
    assert (both - alone).abs().max() > 1e-4  # the register changed what naclip sees
