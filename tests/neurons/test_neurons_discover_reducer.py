"""Discovery's statistic as one reducer of Model.trace: equal to Algorithm 1 computed by hand from
one full cache, whether the searched layers sit before or after the detection block, and merged
exactly from two halves of the images."""

import torch

import vitreg
from conftest import images
from vitreg.analysis.rules import image_mask
from vitreg.neurons.discover import OutlierActivations
from vitreg.testing.tiny import timm_vit

DETECT = 1
LAYERS = (0, 2)  # one searched layer before the detection block, one after


def _stats(model: vitreg.Model, value: float) -> OutlierActivations:
    return OutlierActivations(
        f"blocks.{DETECT}.hook_resid_post",
        [f"blocks.{layer}.mlp.hook_post" for layer in LAYERS],
        [layer > DETECT for layer in LAYERS],
        model.d_mlp,
        "absolute",
        value,
    )


def test_outlier_activations_equal_algorithm_1_by_hand():
    module, size = timm_vit("dinov2_reg4")
    model = vitreg.wrap(module)
    x = images(7, size, seed=3)
    names = [f"blocks.{DETECT}.hook_resid_post", *(f"blocks.{i}.mlp.hook_post" for i in LAYERS)]
    _, cache = model.run_with_cache(x, names=names)
    norms = cache[names[0]].norm(dim=-1)
    patches = norms[:, model.layout.patches]
    value = float(patches.flatten().quantile(0.9))  # about a tenth of the patches are outliers
    mask = image_mask(norms, "absolute", value)
    mask[:, model.layout.prefix] = False
    has = mask.any(1)
    expected = torch.stack(
        [
            torch.stack([cache[n][i][mask[i]].abs().mean(0) for i in range(7) if has[i]]).sum(0)
            for n in names[1:]
        ]
    ).double()

    whole = model.trace(x, [_stats(model, value)], batch_size=3).reducers[0]
    assert whole.images_seen == 7 and whole.images_with == int(has.sum()) > 1
    assert torch.allclose(whole.score_sum, expected, rtol=1e-5, atol=1e-6)
    assert whole.held == {} and whole.weights is None  # nothing of a batch is kept past it

    halves = [
        model.trace(x[s], [_stats(model, value)], batch_size=2).reducers[0]
        for s in (slice(0, 4), slice(4, 7))
    ]
    halves[0].merge(halves[1])
    assert torch.allclose(halves[0].score_sum, whole.score_sum, rtol=1e-6, atol=1e-9)
    assert halves[0].images_with == whole.images_with


def test_the_sparsity_filter_reads_the_signed_activation_as_the_reference_notebook():
    """A unit's per-image score counts only if a fraction ``f`` of the tokens have activation
    below ``a``: the activation itself, so a unit driven far negative (as a SwiGLU product can
    be) is sparse, though its magnitude is large."""
    module, size = timm_vit("dinov2_reg4")
    model = vitreg.wrap(module)
    x = images(5, size, seed=4)
    site, layer = f"blocks.{DETECT}.hook_resid_post", "blocks.2.mlp.hook_post"
    _, cache = model.run_with_cache(x, names=[site, layer])
    acts = cache[layer].float()
    norms = cache[site].norm(dim=-1)
    value = float(norms[:, model.layout.patches].flatten().quantile(0.9))
    mask = image_mask(norms, "absolute", value)
    mask[:, model.layout.prefix] = False
    has = mask.any(1)
    a = float(acts.median())  # a threshold between the signed and the absolute test
    f = 0.5
    signed_keep = (acts < a).float().mean(1) >= f  # [B, U]
    assert not torch.equal(signed_keep, (acts.abs() < a).float().mean(1) >= f)
    per_image = torch.stack([acts[i][mask[i]].abs().mean(0) for i in range(5)])
    expected = (per_image * signed_keep)[has].double().sum(0)

    stats = OutlierActivations(
        site, [layer], [True], model.d_mlp, "absolute", value, sparsity=(a, f)
    )
    got = model.trace(x, [stats], batch_size=2).reducers[0].score_sum[0]
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
