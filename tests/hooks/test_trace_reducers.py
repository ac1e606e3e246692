"""Streaming traces: reducers over batches equal the statistics of one big cache, and merge exactly."""

import pytest
import torch

import vitreg
from conftest import images
from vitreg import Histogram, HookError, InputError, Max, Mean, TokenNorms, TopK
from vitreg.testing.tiny import timm_vit

SITE = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def setup():
    module, size = timm_vit("dinov2_reg4")
    model = vitreg.wrap(module)
    x = images(7, size, seed=3)
    _, cache = model.run_with_cache(x, names=[SITE, "blocks.1.mlp.hook_post"])
    return model, x, cache


def reducers():
    return [
        TokenNorms(SITE),
        Mean(SITE),
        Mean(SITE, of="norm"),
        Max("blocks.1.mlp.hook_post"),
        Max(SITE, of="norm"),
        Histogram(SITE, bins=50, lo=-1, hi=3),
        TopK(SITE, k=5),
    ]


def test_trace_equals_full_cache_statistics(setup):
    model, x, cache = setup
    res = model.trace(x, reducers(), batch_size=3)
    assert res.n_images == 7
    act, neurons = cache[SITE], cache["blocks.1.mlp.hook_post"]
    norms = act.norm(dim=-1)
    lay = model.layout
    tn, mean, mean_norm, mx, mx_norm, hist, top = (r.result() for r in res.reducers)
    assert torch.allclose(tn["norms"], norms, atol=1e-5)
    assert tn["image_index"].tolist() == list(range(7))
    assert torch.allclose(mean["patch"]["mean"], act[:, lay.patches].mean((0, 1)), atol=1e-5)
    assert torch.allclose(mean["register"]["mean"], act[:, lay.registers].mean((0, 1)), atol=1e-5)
    assert mean["cls"]["count"] == 7 and mean["register"]["count"] == 28
    std = act[:, lay.patches].reshape(-1, act.shape[-1]).std(0, unbiased=False)
    assert torch.allclose(mean["patch"]["std"], std, atol=1e-4)
    assert torch.allclose(mean_norm["patch"]["mean"], norms[:, lay.patches].mean(), atol=1e-5)
    flat = neurons.reshape(-1, neurons.shape[-1])
    assert torch.allclose(mx["value"], flat.max(0).values)
    unit = 17
    img, tok = mx["image"][unit], mx["token"][unit]
    assert neurons[img, tok, unit] == mx["value"][unit]
    assert torch.isclose(mx_norm["value"], norms.max())
    assert norms[mx_norm["image"], mx_norm["token"]] == mx_norm["value"]
    total = sum(int(c.sum()) for c in hist["counts"].values())
    assert total == norms.numel() and int(hist["counts"]["register"].sum()) == 28
    assert torch.allclose(top["values"], norms.flatten().topk(5).values)
    assert torch.equal(norms[top["image"], top["token"]], top["values"])
    assert res.layouts[SITE] == lay


def test_merging_two_halves_equals_one_pass(setup):
    model, x, _ = setup

    def summable():
        return [Mean(SITE), Histogram(SITE, bins=50, lo=-1, hi=3)]

    whole = model.trace(x, summable(), batch_size=4).reducers
    first = model.trace(x[:4], summable()).reducers
    second = model.trace(x[4:], summable()).reducers
    for a, b in zip(first, second, strict=True):
        a.merge(b)
    mean, hist = first
    for kind, stats in whole[0].result().items():
        assert torch.allclose(mean.result()[kind]["mean"], stats["mean"], atol=1e-5)
        assert mean.result()[kind]["count"] == stats["count"]
    for kind, counts in whole[1].counts.items():
        assert torch.equal(hist.counts[kind], counts)


def test_positional_reducers_merge_with_global_offsets(setup):
    model, x, cache = setup
    a, b = Max(SITE, of="norm"), Max(SITE, of="norm")
    ta, tb = TopK(SITE, 3), TopK(SITE, 3)
    # two "processes": images 0..2 and 3..6, each reducer told its global image offset
    with model.hooks([(SITE, lambda t, h: (a(t, h, 0), ta(t, h, 0)) and None)]):
        model.features(x[:3])
    with model.hooks([(SITE, lambda t, h: (b(t, h, 3), tb(t, h, 3)) and None)]):
        model.features(x[3:])
    a.merge(b)
    ta.merge(tb)
    norms = cache[SITE].norm(dim=-1)
    assert norms[a.result()["image"], a.result()["token"]] == norms.max()
    assert torch.allclose(ta.result()["values"], norms.flatten().topk(3).values)
    assert a.n_images == 7


def test_trace_accepts_loaders_and_limits(setup):
    model, x, _ = setup
    batches = [(x[:2], torch.zeros(2)), {"image": x[2:5]}, x[5:]]
    seen = []
    res = model.trace(batches, [TokenNorms(SITE)], limit=6, progress=seen.append)
    assert res.n_images == 6 and seen == [2, 5, 6]
    with pytest.raises(InputError, match="yield image tensors"):
        model.trace([["not", "images"]], [TokenNorms(SITE)])
    with pytest.raises(HookError):
        model.trace(x, [TokenNorms("blocks.*.hook_resid_post")])


def test_norms_in_float32_for_half_precision(setup):
    model, x, _ = setup
    t = torch.full((1, 3, 4), 300.0, dtype=torch.float16)  # 600 = norm, 300^2 overflows fp16 sums
    r = TokenNorms(SITE)
    r(t, vitreg.HookContext(SITE, 1, None), 0)
    assert r.result()["norms"].dtype == torch.float32
    assert torch.allclose(r.result()["norms"], torch.full((1, 3), 600.0))


def test_run_with_cache_norm_reduction_and_filters(setup):
    model, x, cache = setup
    _, small = model.run_with_cache(
        x[:2], names=lambda n: n.endswith("hook_resid_post"), reduce="norm"
    )
    assert list(small) == [f"blocks.{i}.hook_resid_post" for i in range(3)]
    assert small[SITE].shape == (2, model.layout.n_tokens)
    assert torch.allclose(small[SITE], cache[SITE][:2].norm(dim=-1), atol=1e-5)
    assert small.stack("blocks.*.hook_resid_post").shape == (3, 2, model.layout.n_tokens)
    with pytest.raises(HookError):
        model.run_with_cache(x[:1], names=[SITE], reduce="mean")


def test_each_reducer_returns_the_statistics_its_type_declares(setup):
    from typing import get_args, get_type_hints

    from vitreg.hooks.reducers import Reducer

    model, x, _ = setup
    res = model.trace(x, reducers(), batch_size=3)
    for r in res.reducers:
        declared = get_type_hints(type(r).result)["return"]
        (base,) = (b for b in type(r).__orig_bases__ if getattr(b, "__origin__", None) is Reducer)
        assert get_args(base) == (declared,), type(r).__name__
        out = r.result()
        if getattr(declared, "__origin__", None) is dict:  # per token type
            (_, declared), out = get_args(declared), next(iter(out.values()))
        assert list(out) == list(get_type_hints(declared)), type(r).__name__
