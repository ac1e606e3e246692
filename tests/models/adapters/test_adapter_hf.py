"""HF transformers adapters: hooked shapes, attention patterns, insertion, edits, loading and errors."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
import transformers  # noqa: E402

import vitreg  # noqa: E402
from conftest import images  # noqa: E402
from vitreg.errors import InputError, SpecError, UnsupportedModelError, WeightsError  # noqa: E402
from vitreg.models.loaders.hf_source import BUILTIN_CONFIGS, ProcessorTransform  # noqa: E402
from vitreg.testing.tiny import HF_DINO, HF_KINDS, HF_VISION, hf_size, hf_tiny  # noqa: E402


@pytest.mark.parametrize("kind", list(HF_KINDS))
def test_hooked_tensors_are_batch_first(kind: str) -> None:
    module = hf_tiny(kind)
    model = vitreg.wrap(module)
    x = images(2, hf_size(model))
    seen: dict[str, tuple] = {}

    def record(t: torch.Tensor, hook) -> None:
        seen[hook.name] = tuple(t.shape)

    with model.hooks([(n, record) for n in model.hook_names()]):
        module(x)
    n = model.layout.n_tokens
    heads, d_head = model.n_heads, model.d_model // model.n_heads
    assert seen["blocks.0.attn.hook_q"] == (2, n, heads, d_head)
    assert seen["blocks.1.attn.hook_pattern"] == (2, heads, n, n)
    assert seen["blocks.1.mlp.hook_post"] == (2, n, model.d_mlp)
    assert seen["ln_final.hook_out"] == (2, n, model.d_model)


@pytest.mark.parametrize("kind", ["dinov2_reg", "clip", "siglip"])
def test_recomputed_pattern_matches_eager_attentions(kind: str) -> None:
    sdpa = hf_tiny(kind)
    eager = hf_tiny(kind, attn="eager")
    eager.load_state_dict(sdpa.state_dict())
    x = images(2, hf_size(vitreg.wrap(sdpa)))
    reference = eager(x, output_attentions=True).attentions
    for module, source in ((sdpa, "recomputed"), (eager, "native")):
        _, cache = vitreg.wrap(module).run_with_cache(x, names="blocks.*.attn.hook_pattern")
        for i, ref in enumerate(reference):
            pattern = cache[f"blocks.{i}.attn.hook_pattern"]
            assert cache.attn_source[f"blocks.{i}.attn.hook_pattern"] == source
            assert (pattern - ref).abs().max() <= 1e-5
            assert torch.allclose(pattern.sum(-1), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("kind", ["dinov2", "clip"])
def test_native_pattern_edits_take_effect(kind: str) -> None:
    module = hf_tiny(kind)
    model = vitreg.wrap(module)
    x = images(2, hf_size(model))
    base = model.features(x)

    def uniform(t: torch.Tensor, hook) -> torch.Tensor:
        return torch.full_like(t, 1.0 / t.shape[-1])

    with pytest.raises(vitreg.HookError, match="recomputed"):  # sdpa: read-only
        with model.hooks([("blocks.0.attn.hook_pattern", uniform)]):
            model.features(x)
    name = "blocks.0.attn.hook_pattern"
    with model.hooks([(name, lambda t, h: t.clone())], attention="native"):
        same = model.features(x)
    with model.hooks([(name, uniform)], attention="native"):
        edited = model.features(x)
        _, cache = model.run_with_cache(x, names=name, attention="native")
    assert (same - base).abs().max() <= 1e-5
    assert (edited - base).abs().max() > 1e-3
    assert torch.allclose(cache[name], torch.full_like(cache[name], 1 / model.layout.n_tokens))
    assert torch.equal(model.features(x), base)  # the eager routing is gone with the hook
    assert module.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kind", ["dinov2_reg", "dinov2_reg_cls", "clip_proj", "siglip"])
def test_insertion_matches_hand_built_reference(kind: str) -> None:
    module = hf_tiny(kind)
    model = vitreg.wrap(module)
    adapter = model.adapter
    tower = adapter.tower
    x = images(2, hf_size(model))
    k = 2
    values = torch.randn(k, model.d_model)
    layout = model.layout.with_extra(k)
    src = layout.with_extra(0)
    # the tokens join before CLIP's pre_layrnorm (DINOv2 and SigLIP have no pre-norm)
    pre_norm = getattr(tower, "pre_layrnorm", torch.nn.Identity())
    with torch.no_grad():
        tokens = tower.embeddings(x)
        raw = [tokens[:, src.prefix], values.expand(2, -1, -1), tokens[:, src.patches]]
        h = pre_norm(torch.cat(raw, 1))
    states = [h]
    with torch.no_grad():
        for layer in adapter.layers:
            h = layer(h, None)
            states.append(h)
        stripped = layout.strip_extra(h)
        if model.family == "hf-dinov2":
            final = tower.layernorm(stripped)
            pooled = final[:, 0]
        elif model.family == "hf-clip":
            final = stripped
            pooled = tower.post_layernorm(stripped[:, 0])
        else:
            final = tower.post_layernorm(stripped)
            pooled = tower.head(final)

    with model.insert_tokens(values):
        assert model.layout == layout
        feats = model.features(x)
        _, ins = model.run_with_cache(
            x, names=["hook_tokens", "blocks.1.hook_resid_post", "ln_final.hook_out"]
        )
        out = tower(x, output_hidden_states=True, output_attentions=True)
        wrapped_out = model(x)
    assert (ins["hook_tokens"] - states[0]).abs().max() <= 1e-5
    assert (ins["blocks.1.hook_resid_post"] - states[-1]).abs().max() <= 1e-5
    assert (feats - final).abs().max() <= 1e-5
    assert (ins["ln_final.hook_out"] - final).abs().max() <= 1e-5
    assert ins.layouts["ln_final.hook_out"] == src
    assert (out.last_hidden_state - final).abs().max() <= 1e-5
    assert (out.pooler_output - pooled).abs().max() <= 1e-5
    assert len(out.hidden_states) == len(states)
    for got, ref in zip(out.hidden_states, states, strict=True):
        assert (got - layout.strip_extra(ref)).abs().max() <= 1e-5
    assert all(a.shape[-1] == src.n_tokens for a in out.attentions or ())
    assert isinstance(wrapped_out, transformers.utils.ModelOutput)
    # removing the handle restores the bare model
    assert model.layout.n_extra == 0
    assert torch.equal(model.features(x), tower(x).last_hidden_state)


def test_insertion_layouts_seen_by_hooks() -> None:
    model = vitreg.wrap(hf_tiny("dinov2_reg"))
    layouts = {}

    def record(t: torch.Tensor, hook) -> None:
        layouts[hook.name] = hook.layout
        hook.layout.check(t)

    names = ["hook_tokens", "blocks.0.attn.hook_q", "ln_final.hook_out"]
    with model.insert_tokens(3), model.hooks([(n, record) for n in names]):
        model.features(images(1, 42))
    tokens = layouts["hook_tokens"]
    assert (tokens.n_cls, tokens.n_reg, tokens.n_extra, tokens.grid) == (1, 2, 3, (3, 3))
    assert tokens.registers == slice(1, 3) and tokens.extra == slice(3, 6)
    assert layouts["ln_final.hook_out"] == tokens.with_extra(0)


def test_llava_style_hidden_state_selection_skips_inserted_tokens() -> None:
    module = hf_tiny("clip")
    model = vitreg.wrap(module)
    x = images(1, 48)
    with model.insert_tokens(2):
        selected = module(x, output_hidden_states=[-2]).hidden_states
    assert [t is None for t in selected] == [True, False, True]
    assert selected[1].shape == (1, model.layout.n_tokens, 32)


@pytest.mark.parametrize("kind", ["dinov2", "dinov2_swiglu", "clip"])
def test_mlp_post_is_the_neurons(kind: str) -> None:
    model = vitreg.wrap(hf_tiny(kind))
    x = images(2, hf_size(model))
    base = model.features(x)
    last = f"blocks.{model.n_layers - 1}"
    mlp = model.adapter.layers[-1].mlp
    out_proj = getattr(mlp, "fc2", None) or mlp.down_proj
    assert model.d_mlp == out_proj.in_features
    with model.hooks([(f"{last}.mlp.hook_post", lambda t, h: torch.zeros_like(t))]):
        edited = model.features(x)
        _, cache = model.run_with_cache(
            x, names=[f"{last}.hook_resid_mid", f"{last}.hook_resid_post"]
        )
    assert (edited - base).abs().max() > 1e-3
    # zero hidden units: the MLP branch is its output bias (times LayerScale for DINOv2)
    branch = out_proj.bias
    scale = getattr(model.adapter.layers[-1], "layer_scale2", None)
    if scale is not None:
        branch = branch * scale.lambda1
    expected = cache[f"{last}.hook_resid_mid"] + branch
    assert (cache[f"{last}.hook_resid_post"] - expected).abs().max() <= 1e-5


def test_qkv_writes_take_effect() -> None:
    model = vitreg.wrap(hf_tiny("dinov2"))
    x = images(2, 42)
    base = model.features(x)
    with model.hooks([("blocks.0.attn.hook_v", lambda t, h: t.clone())]):
        assert torch.equal(model.features(x), base)
    with model.hooks([("blocks.0.attn.hook_v", lambda t, h: torch.zeros_like(t))]):
        assert (model.features(x) - base).abs().max() > 1e-3


def test_image_sizes() -> None:
    dino = vitreg.wrap(hf_tiny("dinov2"))
    assert dino.features(images(1, 56)).shape[1] == 1 + 16  # interpolated position embeddings
    with pytest.raises(InputError, match="multiple of the patch size"):
        dino.features(images(1, 50))
    clip = vitreg.wrap(hf_tiny("clip"))
    with pytest.raises(InputError, match="interpolate_pos_encoding"):
        clip.features(images(1, 64))
    clip.adapter.interpolate_pos_encoding = True
    assert clip.features(images(1, 64)).shape[1] == 1 + 16
    assert clip(images(1, 64)).last_hidden_state.shape[1] == 1 + 16


def test_bad_inputs_and_modules() -> None:
    model = vitreg.wrap(hf_tiny("dinov2"))
    with pytest.raises(InputError, match="channels"):
        model(images(1, 42)[:, :1])
    full = transformers.CLIPModel(
        transformers.CLIPConfig(
            vision_config=HF_VISION, text_config=dict(HF_VISION, num_hidden_layers=1)
        )
    )
    with pytest.raises(UnsupportedModelError, match="vision tower"):
        vitreg.wrap(full)
    with pytest.raises(UnsupportedModelError):
        vitreg.wrap(transformers.Dinov2Backbone(transformers.Dinov2Config(**HF_DINO)))
    assert vitreg.wrap(full.vision_model).family == "hf-clip"


def test_unknown_hub_id_offline() -> None:
    with pytest.raises(WeightsError, match="HF_HUB_OFFLINE"):
        vitreg.load("hf:nobody-vitreg/no-such-model", pretrained=True)
    with pytest.raises(WeightsError, match="HF_HUB_OFFLINE"):
        vitreg.load("hf:nobody-vitreg/no-such-model", pretrained=False)
    with pytest.raises(WeightsError, match="facebook/dinov2-small"):
        vitreg.load("hf:facebook/dinov2-small", pretrained=True)
    with pytest.raises(SpecError, match="ORG/NAME"):
        vitreg.load("hf:dinov2-small", pretrained=False)
    with pytest.raises(SpecError, match="no field"):
        vitreg.load("hf:facebook/dinov2-small", pretrained=False, img_size=56)


def test_builtin_configs() -> None:
    from transformers import AutoConfig

    def cfg(hub_id: str):
        model_type, fields = BUILTIN_CONFIGS[hub_id]
        return AutoConfig.for_model(model_type, **fields)

    small = cfg("facebook/dinov2-small")
    assert (small.hidden_size, small.num_hidden_layers, small.num_attention_heads) == (384, 12, 6)
    assert (small.patch_size, small.image_size, small.layer_norm_eps) == (14, 518, 1e-6)
    giant = cfg("facebook/dinov2-with-registers-giant")
    assert (giant.hidden_size, giant.num_hidden_layers, giant.num_register_tokens) == (1536, 40, 4)
    assert giant.use_swiglu_ffn and not cfg("facebook/dinov2-large").use_swiglu_ffn
    big = cfg("openai/clip-vit-large-patch14-336")
    assert (big.hidden_size, big.intermediate_size, big.num_hidden_layers) == (1024, 4096, 24)
    assert (big.patch_size, big.image_size, big.hidden_act) == (14, 336, "quick_gelu")
    assert len(BUILTIN_CONFIGS) == 11


def test_load_builtin_architectures_offline() -> None:
    small = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=2)
    giant = vitreg.load("hf:facebook/dinov2-giant", pretrained=False, image_size=28, **small)
    assert giant.family == "hf-dinov2" and giant.d_mlp == 128  # SwiGLU: 2/3 of 4x, rounded to 8
    assert giant.features(images(1, 28)).shape == (1, 5, 48)
    assert giant.adapter.attention_path().startswith("sdpa")
    reg = vitreg.load("hf:facebook/dinov2-with-registers-base", pretrained=False, **small)
    assert (reg.layout.n_reg, reg.layout.grid) == (4, (37, 37))
    steps = [type(t).__name__ for t in reg.transform.transforms]
    assert steps[:2] == ["Resize", "CenterCrop"] and reg.transform.transforms[1].size == (224, 224)
    clip = vitreg.load(
        "hf:openai/clip-vit-large-patch14-336", pretrained=False, attn_implementation="eager",
        intermediate_size=96, interpolate_pos_encoding=True, **small,
    )  # fmt: skip
    assert isinstance(clip.module, transformers.CLIPVisionModel)
    assert clip.module.config.hidden_act == "quick_gelu" and clip.d_mlp == 96
    assert clip.adapter.attention_path().startswith("eager")
    assert clip.transform.transforms[1].size == (336, 336)
    assert clip.features(images(1, 28)).shape == (1, 5, 48)  # interpolation was requested


def test_local_directory_with_processor(tmp_path) -> None:
    from safetensors.torch import save_file

    full = transformers.CLIPModel(
        transformers.CLIPConfig(
            vision_config=HF_VISION, text_config=dict(HF_VISION, num_hidden_layers=1)
        )
    )
    full.save_pretrained(tmp_path)
    transformers.CLIPImageProcessor(
        size={"shortest_edge": 48}, crop_size={"height": 48, "width": 48}
    ).save_pretrained(tmp_path)
    model = vitreg.load(f"local:{tmp_path}")
    assert isinstance(model.module, transformers.CLIPVisionModel)
    ref = full.vision_model.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in model.module.state_dict().items())
    assert isinstance(model.transform, ProcessorTransform)
    from PIL import Image

    pixels = model.transform(Image.new("RGB", (64, 80), (200, 10, 10)))
    assert pixels.shape == (3, 48, 48)
    # a weights file with the full model's keys loads into the tower built from the config
    weights = tmp_path / "full.safetensors"
    save_file({k: v.contiguous() for k, v in full.state_dict().items()}, str(weights))
    again = vitreg.load(f"hf:{tmp_path}", pretrained=False, weights=weights)
    assert torch.equal(
        again.module.embeddings.patch_embedding.weight, ref["embeddings.patch_embedding.weight"]
    )
    no_weights = tmp_path / "empty"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tmp_path / "config.json").read_text())
    with pytest.raises(WeightsError, match="model.safetensors"):
        vitreg.load(f"local:{no_weights}")


def test_native_routing_is_scoped_to_the_hooked_layer() -> None:
    """The native route gives one attention module a config copy; the shared config is untouched."""
    module = hf_tiny("dinov2")
    model = vitreg.wrap(module)
    shared = module.config
    attn = model.adapter.layers[0].attention
    with model.add_hook("blocks.0.attn.hook_pattern", lambda t, h: None, attention="native"):
        assert attn.config is not shared and shared._attn_implementation == "sdpa"
        assert model.adapter.layers[1].attention.config is shared
    assert attn.config is shared
