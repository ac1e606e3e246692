"""`vitreg experiment sae`: the seeded TopK SAE, the three arms on a planted circuit of the plant
family (the raw arm spends a larger share of its loss on outlier tokens than their share of
tokens; the excluded and fixed arms have far fewer outlier latents), and named errors for bad
input."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from typer.testing import CliRunner

from vitreg.errors import InputError, VitregError
from vitreg.experiment.sae import check_images, sae_study, split_images
from vitreg.experiment.sae_data import Activations, gather, resolve_layer
from vitreg.experiment.sae_model import train_sae
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.models.wrapping import wrap
from vitreg.results.fix import NeuronsUsed
from vitreg.settings.sae import SaeSettings
from vitreg.testing.images import make_synthetic
from vitreg.testing.planted import random_circuit

pytestmark = pytest.mark.usefixtures("one_thread")  # small matrices: threads only add waiting
N_IMAGES = 48
SMALL = SaeSettings(steps=100, tokens=128, expansion=2, seeds=2)


def used(n: int) -> NeuronsUsed:
    """What the results record of a ground-truth set of ``n`` neurons."""
    return NeuronsUsed(
        source="the planted ground truth",
        model_spec=None,
        n_neurons=n,
        layers=[],
        fingerprint=None,
        fingerprint_matches=None,
        settings={},
    )


@pytest.fixture(scope="module")
def circuit(one_thread):
    """Plant-family circuit 0 (DINOv2-style, 9 blocks, width 128, 4x4 patches), its synthetic
    images and the fix with its true causal units."""
    torch.manual_seed(0)
    module, truth = random_circuit(seed=0)
    model = wrap(module)
    size = module.patch_embed.img_size[0]
    images = truth.normalize(make_synthetic(N_IMAGES, size, 1000, 0.25).images)
    ttr = TestTimeRegisters(NeuronSet.from_pairs(truth.causal_units, model))
    return model, images, ttr, truth


@pytest.fixture(scope="module")
def acts(circuit) -> Activations:
    model, images, ttr, _ = circuit
    return gather(model, images, None, ttr, batch_size=16)


@pytest.fixture(scope="module")
def study(acts, circuit):
    return sae_study(acts, SMALL, used(len(circuit[3].causal_units)))


def test_the_sae_is_seeded_and_keeps_k_latents_and_unit_decoder_rows() -> None:
    x = torch.randn(300, 16)
    settings = SaeSettings(steps=20, tokens=32, expansion=2, k=3)
    a, b = train_sae(x, settings, 5), train_sae(x, settings, 5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    other = train_sae(x, settings, 6)
    assert not torch.equal(a.w_dec, other.w_dec)
    with torch.no_grad():
        z = a.encode(x)
        assert int((z > 0).sum(1).max()) <= 3 and z.shape == (300, 32)
        assert torch.allclose(a.w_dec.norm(dim=1), torch.ones(32), atol=1e-5)
        x_hat, _ = a(x)
    assert x_hat.shape == x.shape


def test_training_lowers_the_reconstruction_error() -> None:
    g = torch.Generator().manual_seed(0)
    codes = torch.randn(8, 12, generator=g)
    picks = torch.randint(0, 8, (400,), generator=g)
    x = codes[picks] * torch.rand(400, 1, generator=g) * 3  # one direction per token
    short = train_sae(x, SaeSettings(steps=1, tokens=64, expansion=2, k=1), 0)
    long = train_sae(x, SaeSettings(steps=300, tokens=64, expansion=2, k=1), 0)
    with torch.no_grad():
        err = [float((s(x)[0] - x).pow(2).mean()) for s in (short, long)]
    assert err[1] < 0.3 * err[0]


def test_a_split_is_seeded_and_keeps_both_parts() -> None:
    a, b = split_images(10, 0.25, 3), split_images(10, 0.25, 3)
    assert torch.equal(a.train, b.train) and len(a.held) == 2 and len(a.train) == 8
    assert sorted([*a.train.tolist(), *a.held.tolist()]) == list(range(10))
    assert not torch.equal(split_images(10, 0.25, 4).held, a.held)
    assert len(split_images(4, 0.9, 0).train) == 1  # never an empty training set


def test_gather_reads_patch_tokens_of_the_raw_and_the_fixed_model(acts, circuit) -> None:
    model = circuit[0]
    assert acts.raw.shape == acts.fixed.shape == (N_IMAGES, model.layout.n_patches, 128)
    assert acts.layer == model.n_layers - 2 and acts.site == f"blocks.{acts.layer}.hook_resid_post"
    raw, fixed = acts.raw.norm(dim=-1), acts.fixed.norm(dim=-1)
    assert float(raw.max() / raw.median()) > 10  # the planted outliers
    assert float(fixed.max() / fixed.median()) < 3  # removed by the fix
    assert not model.layout.n_extra  # the fix is gone again


def test_the_raw_arm_spends_its_loss_on_outlier_tokens(study) -> None:
    raw = next(a for a in study.arms if a.name == "raw")
    share = study.outlier_tokens.mean
    assert 0 < share < 0.1
    assert raw.outlier_loss_share.mean > 3 * share
    assert [a.name for a in study.arms] == ["raw", "excluded", "fixed"]


def test_the_excluded_and_fixed_arms_have_far_fewer_outlier_latents(study) -> None:
    by_name = {a.name: a for a in study.arms}
    raw = by_name["raw"].outlier_latents.mean
    assert raw > 0
    for name in ("excluded", "fixed"):
        assert by_name[name].outlier_latents.mean <= 0.5 * raw, name
    assert by_name["excluded"].outlier_loss_share is None
    assert by_name["fixed"].outlier_loss_share.mean < by_name["raw"].outlier_loss_share.mean
    # the excluded arm trained on fewer tokens: the outliers left out
    assert by_name["excluded"].train_tokens < by_name["raw"].train_tokens


def test_every_measure_has_its_seeds_and_an_interval(study) -> None:
    for arm in study.arms:
        for m in (arm.ordinary_error, arm.dead_latents, arm.outlier_latents):
            assert len(m.values) == SMALL.seeds and m.ci95 is not None
            assert 0 <= m.mean
        assert len(arm.train_tokens) == SMALL.seeds
    assert study.n_latents == 2 * 128 and study.held_out_images == 12


def test_too_few_images_is_a_named_error(acts) -> None:
    few = Activations(acts.raw[:3], acts.fixed[:3], acts.site, acts.layer)
    with pytest.raises(InputError, match="at least 4 images"):
        check_images(few)
    with pytest.raises(InputError, match="at least 4 images"):
        sae_study(few, SMALL, used(1))


def test_a_layer_without_outliers_is_a_named_error(circuit) -> None:
    model, images, ttr, truth = circuit
    early = gather(model, images[:8], 0, ttr, batch_size=8)  # before the outliers emerge
    assert truth.emergence_layer > 0
    with pytest.raises(InputError, match="no outlier tokens at blocks.0"):
        sae_study(early, SMALL, used(1))


def test_a_layer_or_a_fix_the_model_lacks_is_a_named_error(circuit) -> None:
    model, images, _, _ = circuit
    with pytest.raises(InputError, match="has blocks 0..8"):
        resolve_layer(model, 12)
    assert resolve_layer(model, -1) == 8
    outside = NeuronSet.from_pairs([(20, 0)])
    with pytest.raises(VitregError):
        outside.check_applicable(model)
    with pytest.raises(VitregError):
        gather(model, images[:4], None, TestTimeRegisters(outside), batch_size=4)


@pytest.mark.slow  # about 10 s per circuit
@pytest.mark.parametrize("seed", range(5))
def test_on_the_plant_family_the_raw_arm_has_the_worst_ordinary_error_and_most_dead_latents(
    seed: int,
) -> None:
    """The two signatures that hold on every featured circuit (DINOv2, DeiT-III, CLIP, SigLIP,
    EVA; flat and position rules); the loss share and outlier latents vary between them."""
    module, truth = random_circuit(seed=seed)
    model = wrap(module)
    images = truth.normalize(
        make_synthetic(N_IMAGES, module.patch_embed.img_size[0], 1000, 0.25).images
    )
    ttr = TestTimeRegisters(NeuronSet.from_pairs(truth.causal_units, model))
    r = sae_study(gather(model, images, None, ttr, batch_size=16), SMALL, used(1))
    by_name = {a.name: a for a in r.arms}
    raw = by_name["raw"]
    for name in ("excluded", "fixed"):
        other = by_name[name]
        assert raw.dead_latents.mean > 1.5 * other.dead_latents.mean, name
        assert raw.ordinary_error.mean >= 0.98 * other.ordinary_error.mean, name


@pytest.mark.slow
def test_the_command_writes_the_study_of_the_demo_model(tmp_path, monkeypatch) -> None:
    from vitreg.cli.app import app

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    import vitreg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the synthetic model says what it is
        model = vitreg.load("planted:dinov2_s14", img_size=112)
    truth = model.module.vitreg_planted
    NeuronSet.from_pairs(truth.causal_units, model).save(tmp_path / "truth")
    args = ["experiment", "sae", "--img-size", "112", "--limit", "8", "--neurons", "truth.json"]
    args += ["--steps", "30", "--seeds", "2", "--out", "run"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert doc["verb"] == "sae" and doc["command"].startswith("vitreg experiment sae")
    assert [a["name"] for a in doc["results"]["arms"]] == ["raw", "excluded", "fixed"]
    assert (tmp_path / "run" / "figures" / "sae_arms.png").is_file()
    assert "verb: sae" in (tmp_path / "run" / "config.yaml").read_text()
    page = (tmp_path / "run" / "report.md").read_text()
    assert "(b) outliers excluded" in page and "±" in page
    few = CliRunner().invoke(app, [*args[:5], "2", *args[6:-1], "run2"])
    assert few.exit_code == 2 and "at least 4 images" in few.output
