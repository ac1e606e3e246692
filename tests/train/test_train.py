"""Training library: augmentations, data order, accumulation, DINO parts, checkpoints, bad input."""

import json
import math

import pytest
import timm
import torch
from pydantic import ValidationError

from _support.train_helpers import DINO, TINY, AtStep, TinyData, run
from vitreg.errors import InputError, SpecError, WeightsError
from vitreg.models.load import read_state_dict
from vitreg.results.schema import DataInfo
from vitreg.train.augment import dino_view, three_augment
from vitreg.train.data import dataset_index, describe_training_data, generator
from vitreg.train.dino import DinoOptions, DinoRecipe
from vitreg.train.recipe import BatchSpec


def test_augmentations_are_a_function_of_the_generator():
    img = torch.rand(3, 40, 48)
    a = three_augment(img, 32, generator(0, "aug", 5, 1))
    b = three_augment(img, 32, generator(0, "aug", 5, 1))
    c = three_augment(img, 32, generator(0, "aug", 5, 2))
    assert a.shape == (3, 32, 32) and torch.equal(a, b) and not torch.equal(a, c)
    assert 0 <= a.min() and a.max() <= 1
    local = dino_view(img, 16, (0.05, 0.32), generator(1), blur_p=1.0, solarize_p=1.0)
    assert local.shape == (3, 16, 16)


def test_data_order_is_a_seeded_permutation_per_epoch():
    first = [dataset_index(3, step, i, 8, 16) for step in (0, 1) for i in range(8)]
    assert sorted(first) == list(range(16))
    assert first == [dataset_index(3, step, i, 8, 16) for step in (0, 1) for i in range(8)]
    assert first != [dataset_index(4, step, i, 8, 16) for step in (0, 1) for i in range(8)]


def test_the_training_data_block_is_the_typed_data_info_in_its_written_order():
    described = describe_training_data("synthetic-cls:n=16,size=32")
    assert isinstance(described, DataInfo)
    assert (described.n_images, described.n_listed, described.n_usable, described.scanned) == (
        16,
        16,
        16,
        16,
    )
    assert list(described.model_dump(mode="json")) == [
        "description",
        "n_images",
        "skipped",
        "converted",
        "n_listed",
        "n_usable",
        "scanned",
        "log",
        "warnings",
        "dataset",
    ]
    bare = describe_training_data(TinyData(4))  # no scan: counts from its length only
    assert list(bare.model_dump(mode="json")) == [
        "description",
        "n_images",
        "skipped",
        "converted",
        "n_listed",
        "warnings",
    ]
    assert (bare.description, bare.n_images, bare.n_listed) == ("TinyData", 4, 4)


@pytest.mark.parametrize("recipe", ["supervised", "dino"])
def test_accumulation_matches_the_full_batch(tmp_path, recipe):
    steps, k = (3, 4) if recipe == "supervised" else (2, 2)
    full = run(recipe, tmp_path / "full", steps=steps)
    accum = run(recipe, tmp_path / "accum", steps=steps, accum_steps=k)
    assert accum.losses == pytest.approx(full.losses, rel=1e-5)
    # (Adam turns float noise in near-zero gradients, e.g. of the key bias, into full steps,
    # so compare a weight with real gradients rather than every parameter)
    weight = [r.model.patch_embed.proj.weight for r in (full, accum)]
    assert torch.allclose(*weight, atol=1e-5)
    keys = {"step", "loss", "lr", "images_per_s"}
    keys |= (
        {"loss_dino", "loss_ibot", "teacher_temp", "teacher_entropy", "momentum"}
        if recipe == "dino"
        else set()
    )
    logged = [
        json.loads(line) for line in (tmp_path / "full" / "log.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in logged] == list(range(1, steps + 1)) and keys <= set(logged[0])


def dino_recipe(**opts):
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, num_classes=0, dynamic_img_size=True, **TINY
    )
    spec = BatchSpec(TinyData(), 0, 4, 32, (0.5,) * 3, (0.25,) * 3)
    return DinoRecipe(model, spec, DinoOptions(**{**DINO, **opts}), total_steps=10)


def test_dino_mask_token_replaces_masked_patch_embeddings():
    recipe = dino_recipe()
    student = recipe.module
    with torch.no_grad():
        student.mask_token.fill_(7.0)
    seen = []
    student.backbone.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    masks = torch.zeros(2, 16, dtype=torch.bool)
    masks[0, [0, 5]] = True
    student(torch.randn(2, 3, 32, 32), None, masks)
    tokens = seen[0][:, student.backbone.num_prefix_tokens :]
    pos = student.backbone.pos_embed[:, 1:]  # the tiny ViT adds pos-embed to the patch tokens
    assert torch.allclose(tokens[0, [0, 5]] - pos[0, [0, 5]], torch.full((2, 64), 7.0), atol=1e-5)
    assert not torch.allclose(tokens[1, 0] - pos[0, 0], torch.full((64,), 7.0))


def test_dino_step_trains_mask_token_and_moves_teacher_and_centres():
    recipe = dino_recipe(mask_prob=1.0)
    batch = recipe.batch(0, range(4))
    assert batch["global"].shape == (8, 3, 32, 32) and batch["local"].shape == (8, 3, 16, 16)
    assert batch["masks"].any(1).all()
    loss, parts = recipe.loss(recipe.module, batch, 0)
    assert parts["loss_ibot"] > 0 and parts["loss_dino"] > 0
    loss.backward()
    assert recipe.module.mask_token.grad.abs().sum() > 0
    teacher_before = recipe.teacher["backbone"].patch_embed.proj.weight.clone()
    torch.optim.SGD(recipe.module.parameters(), lr=1.0).step()
    recipe.end_step(0, lambda t: t)
    moved = recipe.teacher["backbone"].patch_embed.proj.weight
    student = recipe.module.backbone.patch_embed.proj.weight
    assert not torch.equal(moved, teacher_before) and not torch.allclose(moved, student)
    assert recipe.center.abs().sum() > 0 and recipe.patch_center.abs().sum() > 0


def test_interrupted_run_resumes_with_identical_losses(tmp_path):
    full = run("supervised", tmp_path / "full", checkpoint_every=2)

    def stop(step):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run("supervised", tmp_path / "cut", checkpoint_every=2, progress=AtStep(stop))
    resumed = run("supervised", tmp_path / "cut", checkpoint_every=2)
    assert resumed.resumed_from == 2 and resumed.losses == full.losses
    again = run("supervised", tmp_path / "cut", checkpoint_every=2, resume=False)
    assert again.resumed_from is None and [r["step"] for r in again.history] == [1, 2, 3, 4]


def test_checkpoint_holds_teacher_centre_and_optimizer(tmp_path):
    result = run("dino", tmp_path, checkpoint_every=1, keep_checkpoints=2)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.glob("*.json")) == [
        "step-00000003.json",
        "step-00000004.json",
    ]
    meta = json.loads((folder / "step-00000004.json").read_text())
    assert meta["step"] == 4 and meta["config"]["recipe"] == "dino" and len(meta["sha256"]) == 64
    tensors = read_state_dict(folder / "step-00000004.safetensors")
    assert {"recipe.center", "recipe.patch_center", "module.mask_token"} <= set(tensors)
    assert any(k.startswith("recipe.teacher.backbone.") for k in tensors)
    assert any(k.endswith(".exp_avg_sq") for k in tensors)
    exported = read_state_dict(tmp_path / "model.safetensors")
    assert torch.equal(exported["pos_embed"], result.model.pos_embed)


@pytest.mark.parametrize("damage", ["truncate", "garbage-json"])
def test_corrupted_checkpoint_is_a_weights_error(tmp_path, damage):
    run("supervised", tmp_path, steps=2, checkpoint_every=2)
    if damage == "truncate":
        path = tmp_path / "checkpoints" / "step-00000002.safetensors"
        path.write_bytes(path.read_bytes()[:1000])
        needle = "truncated or corrupted"
    else:
        (tmp_path / "checkpoints" / "step-00000002.json").write_text("{not json")
        needle = "unreadable"
    with pytest.raises(WeightsError, match=needle) as err:
        run("supervised", tmp_path, steps=2, checkpoint_every=2)
    assert "--no-resume" in str(err.value)


def test_resume_with_other_settings_is_refused(tmp_path):
    run("supervised", tmp_path, steps=2)
    with pytest.raises(InputError, match="lr: checkpoint 0.001, now 0.002"):
        run("supervised", tmp_path, steps=2, lr=2e-3)


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"batch_size": 6, "accum_steps": 4}, SpecError, "divisible"),
        ({"recipe": "mae"}, ValidationError, "recipe"),
        ({"options": {"n_crops": 2}}, SpecError, "valid options"),
        ({"epochs": 1}, SpecError, "exactly one of steps and epochs"),
        ({"data": TinyData(labels=False)}, InputError, "needs class labels"),
        ({"data": TinyData(n=0)}, InputError, "empty"),
        ({"model": "vit_nonexistent_patch16"}, SpecError, "unknown model"),
        ({"amp": "fp16"}, SpecError, "CUDA"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, kwargs, error, needle):
    recipe = kwargs.pop("recipe", "supervised")
    model = kwargs.pop("model", None)
    if model is not None:
        from vitreg.train import TrainSettings, train

        settings = TrainSettings(recipe=recipe, steps=1, batch_size=8)
        with pytest.raises(error, match=needle):
            train(model, TinyData(), settings, tmp_path)
        return
    with pytest.raises(error, match=needle):
        run(recipe, tmp_path, **kwargs)


def test_epochs_and_a_model_instance(tmp_path):
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=10, **TINY)
    from vitreg.train import TrainSettings, train

    settings = TrainSettings(recipe="dino", epochs=1, batch_size=8)
    result = train(model, TinyData(), settings, tmp_path, options=DINO)
    assert result.steps == 2 and model.dynamic_img_size and model.num_classes == 0


def test_vitreg_variants_train(tmp_path):
    pytest.importorskip("vitreg.arch.variant")
    from vitreg.train import TrainSettings, train

    kwargs = {**TINY, "init_values": 1e-5}  # the default specialisation includes LayerScale
    common = {"steps": 2, "batch_size": 4, "img_size": 32}
    spec = {"base": "vit_tiny_patch16_224", "registers": 2}
    dino = TrainSettings(recipe="dino", **common)
    dino = train(spec, TinyData(), dino, tmp_path / "d", model_kwargs=kwargs, options=DINO)
    assert dino.model.num_prefix_tokens == 3 and all(map(math.isfinite, dino.losses))
    supervised = TrainSettings(**common)
    named = train(
        "vitreg_vit_tiny_patch16_224", TinyData(), supervised, tmp_path / "s", model_kwargs=kwargs
    )
    assert len(named.losses) == 2 and all(map(math.isfinite, named.losses))
