"""Test-time registers and the other fixes of register neurons on planted ground truth: the edit
rules, batching, the controls, before/after comparison, the attention-bias substitute, export."""

import pytest
import torch

import vitreg
from vitreg.core.layout import TokenLayout
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters, signed_abs_max
from vitreg.hooks.sites import HookContext
from vitreg.neurons.discover import discover
from vitreg.results.fix import TtrDescription
from vitreg.settings.neurons import NeuronSearch
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build, build_unplanted

SIZE = 112


@pytest.fixture(scope="module")
def images():
    return synthetic_images(24, size=SIZE, seed=3, flat_fraction=0.1)


def test_batch_of_8_equals_8_batches_of_1(images):
    module, truth = build("dinov2_s14", img_size=SIZE)
    model = vitreg.wrap(module)
    neurons = NeuronSet(
        [l_ for l_, _ in truth.units], [u for _, u in truth.units], [1.0] * len(truth.units)
    )
    with TestTimeRegisters(neurons, n_registers=2).applied(model):
        together = model.features(images[:8])
        alone = torch.cat([model.features(images[i : i + 1]) for i in range(8)])
        pooled = model(images[:8])
    assert (together - alone).abs().max() <= 1e-5
    assert together.shape[1] == model.layout.n_tokens and pooled.shape[0] == 8


def test_empty_set_leaves_the_model_bare(images):
    module, _ = build("deit3_s16", img_size=SIZE)
    model = vitreg.wrap(module)
    ref = model.features(images[:2])
    with TestTimeRegisters(NeuronSet([], [], [])).applied(model):
        assert torch.equal(model.features(images[:2]), ref)


def paper_edit(acts, units, reg, cls_zero=True):
    """Algorithm 2 written out per image and neuron with loops."""
    out = acts.clone()
    for b in range(acts.shape[0]):
        for u in units:
            peak = acts[b, :, u].max()
            out[b, :, u] = 0
            if not cls_zero:
                out[b, 0, u] = acts[b, 0, u]
            out[b, reg, u] = peak
    return out


def reference_edit(acts, units, reg):
    """The official hook_fn: one signed abs-max over tokens x layer neurons, patches zeroed."""
    out = acts.clone()
    for b in range(acts.shape[0]):
        block = acts[b][:, units]
        hi, lo = block.max(), block.min()
        v = hi if hi.abs() > lo.abs() else lo  # sign_max: a tie goes to the min
        for u in units:
            out[b, 2:, u] = 0  # patches (tokens after [CLS] and the register)
            out[b, reg, u] = v
    return out


def test_edits_match_hand_written_rules():
    g = torch.Generator().manual_seed(0)
    lay = TokenLayout(1, 0, (2, 2), (16, 16), n_extra=1)
    acts = torch.randn(3, lay.n_tokens, 6, generator=g)
    acts[1, 3, 2] = -50.0  # a large negative: reference keeps its sign
    units = [2, 4]
    ctx = HookContext("blocks.0.mlp.hook_post", 0, lay)
    neurons = NeuronSet([0, 0], units, [1.0, 1.0])
    paper = TestTimeRegisters(neurons)._edit(0, units)(acts, ctx)
    assert torch.equal(paper, paper_edit(acts, units, lay.extra.start))
    keep = TestTimeRegisters(neurons, cls="keep")._edit(0, units)(acts, ctx)
    assert torch.equal(keep, paper_edit(acts, units, lay.extra.start, cls_zero=False))
    ref = TestTimeRegisters(neurons, mode="reference")._edit(0, units)(acts, ctx)
    assert torch.equal(ref, reference_edit(acts, units, lay.extra.start))
    assert ref[1, lay.extra.start, 2] == -50.0
    assert signed_abs_max(torch.tensor([[1.0, -3.0, 2.0]]), (1,)).item() == -3.0
    # the official tie rule: |max| == |min| gives the min
    assert signed_abs_max(torch.tensor([[2.0, -2.0, 1.0]]), (1,)).item() == -2.0


def test_several_registers_get_a_seeded_assignment():
    neurons = NeuronSet([0] * 6, list(range(6)), [1.0] * 6)
    a = TestTimeRegisters(neurons, n_registers=3, seed=1).assignment
    assert a == TestTimeRegisters(neurons, n_registers=3, seed=1).assignment
    assert sorted(a.values()) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(vitreg.InputError):
        TestTimeRegisters(neurons, patches="median")


def test_causal_controls(images):
    from vitreg.fix.controls import ablate, random_like, shift_to_patch

    module, truth = build("dinov2_s14", img_size=SIZE)
    model = vitreg.wrap(module)
    neurons = NeuronSet([l_ for l_, _ in truth.units], [u for _, u in truth.units], [1.0] * 5)
    site = f"blocks.{truth.first_outlier_layer + 1}.hook_resid_post"
    x = images[:6]

    def patch_norms():
        _, c = model.run_with_cache(x, names=site, reduce="norm")
        return c.layout(site).take(c[site], "patches")

    base = patch_norms()
    median = base.median()
    with ablate(model, neurons):
        assert patch_norms().max() < 5 * median  # no outliers anywhere, and no register either
    control = random_like(neurons, model.d_mlp, seed=0)
    assert len(control) == 5 and not set(control.pairs()) & set(truth.units)
    assert control.by_layer().keys() == neurons.by_layer().keys()
    with ablate(model, control):
        assert patch_norms().max() > 10 * median  # random units leave the outliers alone
    with shift_to_patch(model, neurons, (0, 0)):
        moved = patch_norms()
    assert (moved[:, 0] > 10 * median).all()  # every image's outlier now sits at patch (0, 0)
    assert moved[:, 1:].max() < 5 * median
    with pytest.raises(vitreg.InputError, match="outside"):
        shift_to_patch(model, neurons, 1000)


def test_compare_fix_before_after(images):
    from vitreg.fix.compare import compare_fix
    from vitreg.results.fix import Comparison

    module, truth = build("dinov2_s14", img_size=SIZE)
    model = vitreg.wrap(module)
    found = discover(model, images[:16], NeuronSearch(top_k=len(truth.units)), batch_size=8)
    cmp = compare_fix(model, TestTimeRegisters(found), images[16:], batch_size=8)
    d = cmp.results  # the typed summary metrics.json holds, made by compare_fix itself
    assert isinstance(d, Comparison) and not hasattr(cmp, "to_dict")
    assert d.outlier_rate_before > 0.03 and d.outlier_rate_after <= 0.01
    assert d.verdict_before and not d.verdict_after
    assert (
        d.register_norm_after[d.detect_layer]
        > 10 * cmp.after.summary.layers[d.detect_layer].quantiles.p50
    )
    assert d.max_patch_norm_after[-1] < d.max_patch_norm_before[-1] / 5
    assert d.pooled_cosine is not None
    assert 0 < d.pooled_cosine.mean <= 1 and d.pooled_cosine.n == 8
    # controls: zeroing the register neurons also removes the outliers; random neurons do not
    ctl = d.controls
    assert ctl["ablate_register_neurons"].outlier_rate <= 0.01
    assert ctl["ablate_random_neurons"].outlier_rate > 0.03
    assert ctl["ablate_random_neurons"].n_neurons == len(found)
    assert ctl["shift_to_patch"].share_of_images_with_top_norm_at_patch == 1.0
    # attention: after the fix no patch draws the [CLS] attention the outliers drew
    sink = truth.first_outlier_layer + 1
    assert d.cls_attention_max_after is not None and d.cls_attention_max_before is not None
    assert d.cls_attention_max_after[sink] < d.cls_attention_max_before[sink]
    assert cmp.attention_before.layer_maps[-1].shape[0] == 4
    assert Comparison.model_validate_json(d.model_dump_json()) == d


def test_a_set_applied_to_a_model_without_artifacts_says_nothing_to_fix(images):
    from vitreg.fix.compare import compare_fix
    from vitreg.report.renderers.fix import verdict_section

    module, truth = build("dinov2_s14", img_size=SIZE)
    search = NeuronSearch(top_k=len(truth.units))
    found = discover(vitreg.wrap(module), images[:16], search, batch_size=8)
    clean = vitreg.wrap(build_unplanted("dinov2_s14", img_size=SIZE))
    d = compare_fix(clean, TestTimeRegisters(found), images[16:], batch_size=8).results
    res = d.residual
    assert res.nothing_to_fix and res.verdict.startswith("no artifacts before the fix")
    # the planted model's threshold is above every patch norm of the model without a plant
    assert res.threshold_from_another_model
    assert res.largest_patch_norm_before < found.settings["threshold_value"]
    text = "\n".join(map(str, verdict_section(d).blocks))
    assert text.startswith("**No artifacts before the fix: nothing to remove.**")
    assert "belongs to another model" in text
    # the dense change is measured on every patch, not only the pooled token
    dense = d.patch_cosine
    assert dense is not None
    assert dense.n == 8 * (SIZE // 14) ** 2 and dense.min <= dense.mean <= 1


def test_export_fixed_model_loads_back_fixed(tmp_path, images):
    import timm

    from vitreg.fix.saved import save_fixed

    module, truth = build("dinov2_s14", img_size=SIZE)
    model = vitreg.wrap(module)
    neurons = NeuronSet([l_ for l_, _ in truth.units], [u for _, u in truth.units], [1.0] * 5)
    neurons.n_layers, neurons.d_mlp = model.n_layers, model.d_mlp
    ttr = TestTimeRegisters(neurons, n_registers=2, seed=3)
    x = images[:3]
    bare = model.features(x)
    with ttr.applied(model):
        fixed = model.features(x)
        logits = model(x)
    out = save_fixed(model, ttr, tmp_path / "fixed", **truth.model_args)
    with pytest.warns(UserWarning, match="test-time registers"):
        again = vitreg.load(f"local:{out}")
    assert again.layout.n_extra == 2
    assert torch.allclose(again.features(x), fixed, atol=1e-6)
    assert torch.allclose(again(x), logits, atol=1e-6)
    # timm's own API reads the same weights, without the fix
    plain = timm.create_model(
        truth.architecture,
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(out / "model.safetensors")),
        **truth.model_args,
    ).eval()
    assert torch.allclose(plain.forward_features(x), bare, atol=1e-6)


def test_attention_bias_substitute_removes_outliers_without_a_register(images):
    from vitreg.fix.attention_bias import AttentionBiasSubstitute
    from vitreg.fix.controls import ablate

    module, truth = build("dinov2_s14", img_size=SIZE)
    model = vitreg.wrap(module)
    neurons = NeuronSet([l_ for l_, _ in truth.units], [u for _, u in truth.units], [1.0] * 5)
    sub = AttentionBiasSubstitute.estimate(model, neurons, images[:12], batch_size=6)
    assert sub.keys.shape == (model.n_layers, model.n_heads, model.d_model // model.n_heads)
    x = images[12:]
    site = f"blocks.{truth.first_outlier_layer + 1}.hook_resid_post"
    with TestTimeRegisters(neurons).applied(model):
        ttr_out = model.features(x)
    with ablate(model, neurons):
        ablated = model.features(x)
    with sub.applied(model):
        out, cache = model.run_with_cache(x, names=site, reduce="norm")
        lay = cache.layout(site)
        assert lay.n_extra == 1
        patches = lay.take(cache[site], "patches")
        assert patches.max() < 5 * patches.median()  # no outliers
    # the substitute stays closer to the test-time-register output than plain ablation
    assert (out - ttr_out).norm() < (ablated - ttr_out).norm()
    assert model.layout.n_extra == 0


def test_settings_make_the_same_fix_as_their_keywords():
    from vitreg.settings.ttr import TtrSettings

    neurons = NeuronSet([3, 3, 5], [1, 7, 2], [1.0, 1.0, 1.0])
    settings = TtrSettings(registers=2, cls="keep", patches="mean", mode="paper")
    made = TestTimeRegisters.from_settings(neurons, settings, seed=4, scale=0.5)
    assert (
        made.describe()
        == TestTimeRegisters(
            neurons, n_registers=2, cls="keep", patches="mean", mode="paper", seed=4, scale=0.5
        ).describe()
    )
    assert (made.n_registers, made.cls, made.patches, made.seed) == (2, "keep", "mean", 4)
    assert made.assignment == TestTimeRegisters(neurons, n_registers=2, seed=4).assignment
    described = made.describe()
    assert isinstance(described, TtrDescription) and described.name == "TestTimeRegisters"
    assert (described.layers, described.n_neurons, described.scale) == ([3, 5], 3, 0.5)
    assert described.model_dump(exclude={"name"}) == made.settings().model_dump()
