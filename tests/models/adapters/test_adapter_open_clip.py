"""open_clip VisionTransformer adapter and ``open_clip:`` loader: features, hooks, attention, insertion."""

from __future__ import annotations

import warnings

import pytest
import torch

import vitreg
from vitreg import SpecError, WeightsError

open_clip = pytest.importorskip("open_clip")
from vitreg.testing.tiny import (  # noqa: E402
    OPEN_CLIP_BASE,
    OPEN_CLIP_TOWERS,
    embeds_before_ln_pre,
    open_clip_images,
    open_clip_tower,
    run_blocks,
)


def bare_features(tower: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The token sequence the tower computes, assembled from its own parts (no vitreg)."""
    tokens = tower.transformer(tower._embeds(x))
    return tokens if tower.final_ln_after_pool else tower.ln_post(tokens)


@pytest.fixture(params=list(OPEN_CLIP_TOWERS))
def tower(request):
    return open_clip_tower(request.param)


def test_features_are_the_towers_own_token_sequence(tower):
    model = vitreg.wrap(tower)
    assert model.family == "open_clip-vit"
    x = open_clip_images(tower)
    with torch.inference_mode():
        assert (model.features(x) - bare_features(tower, x)).abs().max() <= 1e-5


def test_clipa_notes_that_ln_post_normalises_the_pooled_vector_only():
    """Its hook names (no ln_final.hook_out) are pinned in the adapter matrix."""
    clipa = vitreg.wrap(open_clip_tower("clipa"))
    assert any("ln_post" in note for note in clipa.notes)


def test_layout_and_shapes_are_batch_first():
    model = vitreg.wrap(open_clip_tower("quickgelu"))
    lay = model.layout
    assert (lay.n_cls, lay.n_reg, lay.grid, lay.patch_size) == (1, 0, (4, 6), (8, 8))
    _, cache = model.run_with_cache(open_clip_images(model.module))
    n, h = lay.n_tokens, model.n_heads
    assert cache["hook_tokens"].shape == (2, n, 64)
    assert cache["blocks.0.attn.hook_q"].shape == (2, n, h, 64 // h)
    assert cache["blocks.1.attn.hook_pattern"].shape == (2, h, n, n)
    assert cache["blocks.1.mlp.hook_post"].shape == (2, n, model.d_mlp)
    assert cache["ln_final.hook_out"].shape == (2, n, 64)


def test_sequence_first_blocks_give_the_same_canonical_tensors():
    x = open_clip_images(open_clip_tower("gelu"))
    _, batch_first = vitreg.wrap(open_clip_tower("gelu")).run_with_cache(x)
    _, seq_first = vitreg.wrap(open_clip_tower("seq_first")).run_with_cache(x)
    assert list(batch_first) == list(seq_first)
    for name, value in batch_first.items():
        assert seq_first[name].shape == value.shape, name
        assert (seq_first[name] - value).abs().max() <= 1e-5, name


def test_hook_points_are_the_documented_modules():
    tower = open_clip_tower("quickgelu")
    blk = tower.transformer.resblocks[1]
    _, cache = vitreg.wrap(tower).run_with_cache(open_clip_images(tower))
    with torch.inference_mode():
        post = blk.mlp.gelu(blk.mlp.c_fc(cache["blocks.1.ln2.hook_out"]))
        tokens = tower._embeds(open_clip_images(tower))
    assert isinstance(blk.mlp.gelu, open_clip.transformer.QuickGELU)
    assert torch.allclose(cache["blocks.1.mlp.hook_post"], post, atol=1e-6)
    assert torch.allclose(cache["hook_tokens"], tokens, atol=1e-6)  # after ln_pre


def test_q_k_v_and_pattern_reproduce_the_attention_branch(tower):
    model = vitreg.wrap(tower)
    _, cache = model.run_with_cache(open_clip_images(tower), names="blocks.1.*")
    blk = tower.transformer.resblocks[1]
    pattern, v = cache["blocks.1.attn.hook_pattern"], cache["blocks.1.attn.hook_v"]
    mixed = (pattern @ v.transpose(1, 2)).transpose(1, 2).flatten(2)  # [B, N, C]
    with torch.inference_mode():
        branch = blk.ls_1(blk.attn.out_proj(mixed))
    resid = cache["blocks.1.hook_resid_mid"] - cache["blocks.1.hook_resid_pre"]
    assert (branch - resid).abs().max() <= 1e-5


# attention ---------------------------------------------------------------------------------
def test_native_pattern_equals_recomputed(tower):
    model = vitreg.wrap(tower)
    x, names = open_clip_images(tower), "blocks.*.attn.hook_pattern"
    _, rec = model.run_with_cache(x, names=names)
    _, nat = model.run_with_cache(x, names=names, attention="native")
    for name in model.resolve(names):
        assert rec.attn_source[name] == "recomputed" and nat.attn_source[name] == "native"
        assert (rec[name] - nat[name]).abs().max() <= 1e-5
        assert torch.allclose(nat[name].sum(-1), torch.ones(()), atol=1e-5)
    assert all("attention" not in vars(b) for b in tower.transformer.resblocks)
    assert "recomputed" in model.adapter.attention_path()


def test_native_hooks_stack_and_the_override_goes_with_the_last():
    tower = open_clip_tower("gelu")
    model, blk = vitreg.wrap(tower), tower.transformer.resblocks[0]
    seen: list[str] = []
    first = model.add_hook("blocks.0.attn.hook_pattern", lambda t, h: seen.append("a"), "native")
    second = model.add_hook("blocks.0.attn.hook_pattern", lambda t, h: seen.append("b"), "native")
    model.features(open_clip_images(tower))
    first.remove()
    assert "attention" in vars(blk)
    model.features(open_clip_images(tower))
    second.remove()
    assert "attention" not in vars(blk) and seen == ["a", "b", "b"]


# edits ---------------------------------------------------------------------------------------
def test_mlp_edit_changes_outputs_and_removal_restores(tower):
    model = vitreg.wrap(tower)
    x = open_clip_images(tower)
    ref_feats, ref_out = model.features(x), model(x)

    def zero_units(t, hook):
        t = t.clone()
        t[..., :16] = 0
        return t

    with model.hooks([("blocks.0.mlp.hook_post", zero_units)]):
        feats, out = model.features(x), model(x)
    assert (feats - ref_feats).abs().max() > 1e-3
    assert (out - ref_out).abs().max() > 1e-3
    assert torch.equal(model.features(x), ref_feats)


# token insertion -----------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["gelu", "clipa", "seq_first"])
def test_insertion_matches_hand_built_reference(key):
    tower = open_clip_tower(key)
    tower.output_tokens = True  # forward returns (pooled, tokens)
    model = vitreg.wrap(tower)
    x = open_clip_images(tower)
    extra = torch.randn(3, model.d_model)
    src = model.layout
    lay = src.with_extra(3)
    with torch.inference_mode():
        tokens = torch.empty(2, lay.n_tokens, model.d_model)
        tokens[:, lay.source_indices()] = embeds_before_ln_pre(tower, x)
        tokens[:, lay.extra] = extra  # joined before ln_pre, as in the official TTR code
        final = run_blocks(tower, tower.ln_pre(tokens))
        kept = lay.strip_extra(final)
        ref_feats = kept if tower.final_ln_after_pool else tower.ln_post(kept)
        ref_pooled, ref_tokens = tower._pool(kept)
        ref_pooled = ref_pooled @ tower.proj

    with model.insert_tokens(extra):
        assert model.layout == lay
        feats = model.features(x)
        pooled, out_tokens = model(x)
        names = ["blocks.1.hook_resid_post", "ln_final.hook_out"]
        _, ins = model.run_with_cache(x, names=[n for n in names if n in model.hook_names()])
        with torch.inference_mode():
            inter = tower.forward_intermediates(x, output_extra_tokens=True)
    assert (feats - ref_feats).abs().max() <= 1e-5
    assert (pooled - ref_pooled).abs().max() <= 1e-5
    assert out_tokens.shape == ref_tokens.shape and (out_tokens - ref_tokens).abs().max() <= 1e-5
    assert (ins["blocks.1.hook_resid_post"] - final).abs().max() <= 1e-5
    assert ins.layout("blocks.1.hook_resid_post") == lay
    if "ln_final.hook_out" in ins:
        assert ins.layout("ln_final.hook_out") == src
        assert (ins["ln_final.hook_out"] - ref_feats).abs().max() <= 1e-5
    # forward_intermediates (one hard-coded prefix token) sees the source tokens only
    last = inter["image_intermediates"][-1]
    assert last.shape == (2, model.d_model, *src.grid)
    expected = src.patch_grid(kept).permute(0, 3, 1, 2)
    assert (last - expected).abs().max() <= 1e-5
    assert (inter["image_intermediates_prefix"][-1] - kept[:, src.cls]).abs().max() <= 1e-5
    assert (inter["image_features"] - ref_pooled).abs().max() <= 1e-5
    # removal restores the tower
    assert "forward_intermediates" not in vars(tower.transformer)
    assert model.layout == src
    with torch.inference_mode():
        assert (model.features(x) - bare_features(tower, x)).abs().max() <= 1e-5


def test_inserted_tokens_receive_hooks_and_attention():
    tower = open_clip_tower("gelu")
    model = vitreg.wrap(tower)
    with model.insert_tokens(2):
        _, cache = model.run_with_cache(open_clip_images(tower), names="blocks.0.attn.hook_pattern")
    lay = cache.layout("blocks.0.attn.hook_pattern")
    assert lay.n_extra == 2
    assert cache["blocks.0.attn.hook_pattern"].shape[-1] == lay.n_tokens


# inputs and preprocessing --------------------------------------------------------------------


def test_transform_is_open_clips_eval_preprocess():
    from PIL import Image

    model = vitreg.wrap(open_clip_tower("quickgelu"))
    cfg = model.adapter.data_config()
    assert cfg["input_size"] == (3, 32, 48)
    assert cfg["mean"] == tuple(open_clip.OPENAI_DATASET_MEAN)
    x = model.transform(Image.new("RGB", (100, 80)))
    assert x.shape == (3, 32, 48)
    model.features(x.unsqueeze(0))


# loader ------------------------------------------------------------------------------------
TINY_TEXT = dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)


@pytest.fixture
def tiny_archs(monkeypatch):
    """Register tiny open_clip architectures (and a fake tag) for the duration of a test."""
    from open_clip import factory, pretrained

    vision = {k: v for k, v in OPEN_CLIP_BASE.items()}
    timm_vision = dict(timm_model_name="test_vit", timm_pool="", image_size=160)
    monkeypatch.setitem(
        factory._MODEL_CONFIGS,
        "vitreg-tiny",
        dict(embed_dim=16, vision_cfg=vision, text_cfg=TINY_TEXT),
    )
    monkeypatch.setitem(
        factory._MODEL_CONFIGS,
        "vitreg-tiny-timm",
        dict(embed_dim=16, vision_cfg=timm_vision, text_cfg=TINY_TEXT),
    )
    fake = dict(
        hf_hub="vitreg-test/no-such-repo/", quick_gelu=True, mean=(0.5,) * 3, std=(0.5,) * 3
    )
    monkeypatch.setitem(pretrained._PRETRAINED, "vitreg-tiny", {"fake": fake})


def test_load_arch_alone_builds_random_weights():
    with pytest.warns(UserWarning, match="random"):
        model = vitreg.load("open_clip:ViT-S-32")
    assert model.family == "open_clip-vit"
    assert model.layout.grid == (7, 7) and model.layout.n_cls == 1
    assert model.transform.transforms[1].size == (224, 224)


def test_pretrained_false_is_silent(tiny_archs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model = vitreg.load("open_clip:vitreg-tiny/fake", pretrained=False)
    assert isinstance(model.module, open_clip.transformer.VisionTransformer)
    assert model.features(torch.randn(1, 3, 32, 32)).shape == (1, 17, 64)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("open_clip:ViT-B-17", "ViT-B-16"),
        ("open_clip:vit-b-16", "ViT-B-16"),
        ("open_clip:ViT-B-16/nope", "laion2b_s34b_b88k"),
    ],
)
def test_unknown_names_raise_spec_error(spec, match):
    with pytest.raises(SpecError, match=match):
        vitreg.load(spec)


def test_offline_tag_raises_weights_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(WeightsError) as err:
        vitreg.load("open_clip:ViT-B-32/laion2b_s34b_b79k")
    msg = str(err.value)
    for needle in (
        "laion/CLIP-ViT-B-32-laion2B-s34B-b79K",
        "HF_HUB_OFFLINE",
        "--weights FILE",
        "weights=FILE",
        "--random-init",
    ):
        assert needle in msg


def test_hub_errors_while_building_become_weights_errors(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(open_clip, "create_model_and_transforms", offline)
    with pytest.raises(WeightsError, match="HF_HUB_OFFLINE"):
        vitreg.load("open_clip:ViT-S-32", pretrained=False)


def test_weights_file_roundtrip_and_tag_preprocessing(tiny_archs, tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(3)
    source = open_clip.create_model("vitreg-tiny")
    path = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))

    with pytest.warns(UserWarning, match="defaults"):
        plain = vitreg.load("open_clip:vitreg-tiny", weights=path)
    for key, value in plain.module.state_dict().items():
        assert torch.equal(value, source.visual.state_dict()[key]), key

    with pytest.warns(UserWarning, match="QuickGELU"):
        tagged = vitreg.load("open_clip:vitreg-tiny/fake", weights=path)
    assert tagged.transform.transforms[-1].mean == (0.5, 0.5, 0.5)

    torch.save({"visual.conv1.weight": torch.zeros(3)}, tmp_path / "bad.pth")
    with pytest.raises(WeightsError, match="complete open_clip checkpoint"):
        vitreg.load("open_clip:vitreg-tiny", weights=tmp_path / "bad.pth")


def test_fake_tag_offline_is_a_weights_error(tiny_archs, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(WeightsError, match="vitreg-test/no-such-repo"):
        vitreg.load("open_clip:vitreg-tiny/fake")


def test_quickgelu_notes_point_to_the_faithful_arch():
    from vitreg.models.loaders.open_clip_source import _gelu_note

    (note,) = _gelu_note("ViT-B-16", "openai", {})
    assert "open_clip:ViT-B-16-quickgelu/openai" in note
    assert _gelu_note("ViT-B-16-quickgelu", "openai", {}) == []
    assert _gelu_note("ViT-B-16", "openai", {"force_quick_gelu": True}) == []
    assert _gelu_note("ViT-B-16", "laion2b_s34b_b88k", {}) == []


def test_timm_trunk_routes_to_the_timm_adapter(tiny_archs):
    with pytest.warns(UserWarning, match="trunk"):
        model = vitreg.load("open_clip:vitreg-tiny-timm", pretrained=False)
    assert model.family == "timm-vit"
    assert type(model.module).__module__ == "timm.models.vision_transformer"


@pytest.mark.slow
def test_real_timm_trunk_arch_routes_to_the_timm_adapter():
    with pytest.warns(UserWarning, match="trunk"):
        model = vitreg.load("open_clip:vit_medium_patch16_gap_256", pretrained=False)
    assert model.family == "timm-vit"
    assert model.layout.grid == (16, 16)
