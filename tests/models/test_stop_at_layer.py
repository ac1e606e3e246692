"""``stop_at_layer``: blocks 0..k-1 run, their sites equal a full run, nothing later fires, and
the model is left exactly as a normal run leaves it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import timm
import torch

import vitreg
from conftest import images
from vitreg.errors import InputError
from vitreg.hooks.reducers import TokenNorms

transformers = pytest.importorskip("transformers")

DEPTH = 3
TOL = 1e-6


def _perturb(module: torch.nn.Module, scale: float = 0.02) -> torch.nn.Module:
    """Make every token distinct (zero-initialised prefix tokens, biases, LayerScale)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return module.eval()


def timm_vit() -> tuple[torch.nn.Module, int]:
    torch.manual_seed(0)
    m = timm.create_model(
        "vit_small_patch14_reg4_dinov2", pretrained=False, depth=DEPTH, img_size=56
    )
    return _perturb(m), 56


def eva() -> tuple[torch.nn.Module, int]:
    torch.manual_seed(0)
    m = timm.create_model("eva02_tiny_patch14_224", pretrained=False, depth=DEPTH, img_size=56)
    return _perturb(m), 56


def hf_dinov2() -> tuple[torch.nn.Module, int]:
    torch.manual_seed(0)
    cfg = transformers.Dinov2Config(
        hidden_size=32, num_hidden_layers=DEPTH, num_attention_heads=2, image_size=42, patch_size=14
    )
    return _perturb(transformers.Dinov2Model._from_config(cfg)), 42


def swin() -> tuple[torch.nn.Module, int]:
    torch.manual_seed(0)
    m = timm.create_model(
        "swin_tiny_patch4_window7_224",
        pretrained=False,
        img_size=56,
        depths=(1, 2, 1, 1),
        embed_dim=48,
    )
    return m.eval(), 56


BUILDERS: dict[str, Callable[[], tuple[torch.nn.Module, int]]] = {
    "timm_vit": timm_vit,
    "eva": eva,
    "hf_dinov2": hf_dinov2,
}
PLAIN = list(BUILDERS)


def wrapped(key: str) -> tuple[vitreg.Model, torch.Tensor]:
    module, size = {**BUILDERS, "swin": swin}[key]()
    return vitreg.wrap(module), images(2, size)


def n_torch_hooks(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def ran_before(model: vitreg.Model, name: str, k: int) -> bool:
    """True when site ``name`` runs in a pass that stops before block ``k``: a block site when
    its block is below ``k``; another site when it comes before the stop in forward order (the
    input of block ``k``, or after block ``n - 1`` for ``k = n``: no final norm)."""
    sites = list(model.adapter.sites().items())
    layer = model.site(name).layer
    if layer is not None:
        return layer < k
    layers = [s.layer for _, s in sites]
    if k < model.n_layers:
        cut = layers.index(k)
    else:
        cut = max(i for i, lay in enumerate(layers) if lay == k - 1) + 1
    return [n for n, _ in sites].index(name) < cut


def expected_output(model: vitreg.Model, full: dict, k: int) -> torch.Tensor:
    """What a pass stopped at ``k`` returns: block ``k``'s input (the last block's output)."""
    layer, suffix = (k, "hook_resid_pre") if k < model.n_layers else (k - 1, "hook_resid_post")
    name = next(
        n for n in model.hook_names() if model.site(n).layer == layer and n.endswith(suffix)
    )
    t = full[name]
    if model.adapter.hierarchical:
        return t.flatten(1, 2)
    return model.layout.strip_extra(t)


@pytest.mark.parametrize("key", [*PLAIN, "swin"])
def test_sites_that_ran_equal_a_full_run(key: str) -> None:
    model, x = wrapped(key)
    n = model.n_layers
    names = model.hook_names()
    full_out, full = model.run_with_cache(x, names=names)
    for k in range(n + 1):
        out, cache = model.run_with_cache(x, names=names, stop_at_layer=k)
        want = [name for name in names if ran_before(model, name, k)]
        assert list(cache.keys()) == want, k
        for name in want:
            assert (cache[name] - full[name]).abs().max().item() <= TOL, (k, name)
            assert cache.layout(name) == full.layout(name)
        ref = expected_output(model, full, k)
        assert out.shape == ref.shape and (out - ref).abs().max().item() <= TOL, k
    assert (model.features(x) - full_out).abs().max().item() == 0


@pytest.mark.parametrize("key", PLAIN)
def test_later_blocks_hooks_never_fire(key: str) -> None:
    model, x = wrapped(key)
    fired: list[str] = []

    def record(t: torch.Tensor, hook) -> None:
        fired.append(hook.name)

    k = 2
    later = [n for n in model.hook_names() if not ran_before(model, n, k)]
    assert later and "ln_final.hook_out" in later
    with model.hooks([(n, record) for n in later]):  # attached beforehand, not by the run
        model.features(x, stop_at_layer=k)
        model.run_with_cache(x, names="blocks.0.*", stop_at_layer=k)
        model.trace(x, [TokenNorms("blocks.1.hook_resid_post")], stop_at_layer=k)
        model.run_batches(x, batch_size=1, stop_at_layer=k)
        assert fired == []
        model.run_with_hooks(x, [(n, record) for n in later], stop_at_layer=k)
    assert fired == []
    # asked through the run itself, hooks of blocks >= k are not even attached
    _, cache = model.run_with_cache(x, names="blocks.*.hook_resid_pre", stop_at_layer=0)
    assert len(cache.keys()) == 0


@pytest.mark.parametrize("key", PLAIN)
def test_normal_forward_after_a_stop_equals_the_bare_model(key: str) -> None:
    model, x = wrapped(key)
    module = model.module
    bare = model.adapter.features(x).detach().clone()
    before = n_torch_hooks(module)
    for k in (0, 1, model.n_layers):
        model.run_with_cache(x, names="blocks.*.hook_resid_post", stop_at_layer=k)
        model.features(x, stop_at_layer=-1)
    assert n_torch_hooks(module) == before
    assert torch.equal(model.adapter.features(x), bare)
    assert torch.equal(model.features(x), model.layout.strip_extra(bare))


@pytest.mark.parametrize("key", PLAIN)
def test_inserted_tokens_bookkeeping(key: str) -> None:
    model, x = wrapped(key)
    base_layout = model.layout
    bare = model.features(x)
    with model.insert_tokens(2):
        full_out, full = model.run_with_cache(x, names="blocks.*.hook_resid_post")
        out, cache = model.run_with_cache(x, names="blocks.*.hook_resid_post", stop_at_layer=2)
        assert model.layout.n_extra == 2 and cache.layout("blocks.1.hook_resid_post").n_extra == 2
        assert cache["blocks.1.hook_resid_post"].shape[1] == model.layout.n_tokens
        assert torch.equal(cache["blocks.1.hook_resid_post"], full["blocks.1.hook_resid_post"])
        # the returned stream has the inserted tokens removed, like features()
        assert torch.equal(out, model.layout.strip_extra(full["blocks.1.hook_resid_post"]))
        assert out.shape[1] == base_layout.n_tokens
        # a full run after a stopped one is unchanged
        assert torch.equal(model.run_with_cache(x, names=[])[0], full_out)
    assert model.layout == base_layout
    assert (model.features(x) - bare).abs().max().item() == 0


def test_gradients_flow_through_a_stopped_pass() -> None:
    model, x = wrapped("timm_vit")
    x = x.requires_grad_(True)
    out = model.features(x, stop_at_layer=1)
    out.norm().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_trace_with_stop_equals_full_trace() -> None:
    model, x = wrapped("timm_vit")
    full = model.trace(x, [TokenNorms("blocks.1.hook_resid_post")], batch_size=1)
    short = model.trace(x, [TokenNorms("blocks.1.hook_resid_post")], batch_size=1, stop_at_layer=2)
    a, b = full["blocks.1.hook_resid_post"][0], short["blocks.1.hook_resid_post"][0]
    assert short.n_images == 2 and torch.equal(a.result()["norms"], b.result()["norms"])


@pytest.mark.parametrize("bad", [DEPTH + 1, -DEPTH - 1, 100, 1.0, True, "2"])
def test_bad_stop_at_layer_is_a_clear_input_error(bad: object) -> None:
    model, x = wrapped("timm_vit")
    with pytest.raises(InputError, match="stop_at_layer"):
        model.run_with_cache(x, names="blocks.0.hook_resid_post", stop_at_layer=bad)
    with pytest.raises(InputError, match="stop_at_layer"):
        model.trace(x, [TokenNorms("blocks.0.hook_resid_post")], stop_at_layer=bad)
    assert n_torch_hooks(model.module) == n_torch_hooks(wrapped("timm_vit")[0].module)


def test_negative_stop_counts_from_the_end() -> None:
    model, x = wrapped("timm_vit")
    _, full = model.run_with_cache(x, names="blocks.*.hook_resid_*")
    for k in range(-DEPTH, 0):
        assert torch.equal(
            model.features(x, stop_at_layer=k), expected_output(model, full, DEPTH + k)
        )


def test_stop_layer_is_the_smallest_stop_that_serves_the_names() -> None:
    model, _ = wrapped("timm_vit")
    assert model.stop_layer("blocks.1.hook_resid_post") == 2
    assert model.stop_layer(["blocks.0.mlp.hook_post", "blocks.2.ln1.hook_in"]) == 3
    assert model.stop_layer(["hook_embed", "hook_tokens"]) == 0
    assert model.stop_layer(["blocks.0.hook_resid_post", "ln_final.hook_out"]) is None
    swin_model, _ = wrapped("swin")
    assert swin_model.stop_layer("stages.1.blocks.0.hook_resid_post") == 2
    assert swin_model.stop_layer("stages.0.hook_out") == 1  # stage 1 starts with block 1
    assert swin_model.stop_layer("stages.3.hook_out") is None


def open_clip_seq_first() -> tuple[torch.nn.Module, int]:
    """An open_clip tower whose blocks run sequence-first ([N, B, C]), as older versions did."""
    pytest.importorskip("open_clip")
    from open_clip.model import CLIPVisionCfg, _build_vision_tower

    torch.manual_seed(0)
    cfg = CLIPVisionCfg(width=64, layers=DEPTH, head_width=32, patch_size=8, image_size=32)
    tower = _perturb(_build_vision_tower(16, cfg), 0.1)
    tower.transformer.batch_first = False
    for blk in tower.transformer.resblocks:
        blk.attn.batch_first = False
    return tower, 32


def test_open_clip_sequence_first_blocks() -> None:
    module, size = open_clip_seq_first()
    model, x = vitreg.wrap(module), images(2, size)
    names = model.hook_names()
    _, full = model.run_with_cache(x, names=names)
    with model.insert_tokens(1):
        _, full_ins = model.run_with_cache(x, names="blocks.*.hook_resid_*")
        out_ins = model.features(x, stop_at_layer=2)
        assert torch.equal(out_ins, model.layout.strip_extra(full_ins["blocks.2.hook_resid_pre"]))
    for k in range(DEPTH + 1):
        out, cache = model.run_with_cache(x, names=names, stop_at_layer=k)
        assert list(cache.keys()) == [n for n in names if ran_before(model, n, k)]
        assert all(torch.equal(cache[n], full[n]) for n in cache.keys())
        assert torch.equal(out, expected_output(model, full, k))


def test_stop_at_zero_returns_the_tokens_entering_block_zero_with_edits() -> None:
    model, x = wrapped("timm_vit")

    def shift(t: torch.Tensor, hook) -> torch.Tensor:
        return t + 1.0

    _, cache = model.run_with_cache(x, names="hook_tokens")
    out = model.run_with_hooks(x, [("hook_tokens", shift)], stop_at_layer=0)
    assert torch.equal(out, cache["hook_tokens"] + 1.0)
