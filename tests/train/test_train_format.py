"""The files a run writes keep their format: a checkpoint made by an earlier vitreg (kept in
``_old_run/``: two-step runs stopped after their step-1 checkpoint) resumes, repeats the loss
its run logged at step 2, and the new sidecar holds the config in the same form; the resolved
config a run returns is the typed model its files hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vitreg.errors import InputError
from vitreg.results.train import (
    DinoOptions,
    ResolvedTrainConfig,
    SupervisedOptions,
    TrainedInstance,
    TrainedModel,
    TrainedVariant,
    TrainingData,
)
from vitreg.settings.train import TrainSettings
from vitreg.train import train
from vitreg.train.config import check_resume

OLD = Path(__file__).parent / "_old_run"
KWARGS = {"embed_dim": 8, "depth": 1, "num_heads": 1, "patch_size": 8}
OPTIONS = {
    "supervised": {},
    "dino": {"out_dim": 8, "hidden_dim": 8, "bottleneck_dim": 4, "n_local_crops": 1},
}


def resume_old(recipe: str, out: Path):
    shutil.copytree(OLD / recipe, out)
    settings = TrainSettings(
        recipe=recipe, steps=2, batch_size=2, img_size=16, checkpoint_every=1, seed=3
    )
    return train(
        "vit_tiny_patch16_224",
        "synthetic-cls:n=4,size=16",
        settings,
        out,
        model_kwargs=KWARGS,
        options=OPTIONS[recipe],
    )


@pytest.mark.parametrize("recipe", ["supervised", "dino"])
def test_a_checkpoint_of_an_earlier_vitreg_resumes_with_the_same_config(tmp_path, recipe):
    logged = [json.loads(line) for line in (OLD / recipe / "log.jsonl").read_text().splitlines()]
    old = json.loads((OLD / recipe / "checkpoints" / "step-00000001.json").read_text())
    result = resume_old(recipe, tmp_path / recipe)
    assert result.resumed_from == 1 and result.steps == 2
    assert result.losses[1] == pytest.approx(logged[1]["loss"], rel=1e-5)
    new = json.loads((tmp_path / recipe / "checkpoints" / "step-00000002.json").read_text())
    assert list(new) == list(old)  # the sidecar's fields, in order
    assert json.dumps(new["config"]) == json.dumps(old["config"])  # values and key order
    written = json.loads((tmp_path / recipe / "train.json").read_text())["config"]
    assert json.dumps(written) == json.dumps(old["config"])


def test_the_resolved_config_is_the_typed_model_the_files_hold(tmp_path):
    result = resume_old("dino", tmp_path / "dino")
    config = result.config
    assert isinstance(config, ResolvedTrainConfig)
    assert isinstance(config.options, DinoOptions) and config.options.out_dim == 8
    assert config.model == TrainedModel(name="vit_tiny_patch16_224", kwargs=KWARGS)
    assert isinstance(config.data, TrainingData) and config.data.n == 4
    saved = json.loads((tmp_path / "dino" / "train.json").read_text())["config"]
    assert ResolvedTrainConfig.model_validate(saved) == config


def test_a_resume_with_other_options_is_refused_naming_them():
    old = json.loads((OLD / "dino" / "checkpoints" / "step-00000001.json").read_text())
    config = ResolvedTrainConfig.model_validate(old["config"])
    check_resume(config, old["config"], step=1)  # the same settings resume
    other = config.model_copy(update={"options": DinoOptions(**{**OPTIONS["dino"], "out_dim": 16})})
    with pytest.raises(InputError, match="options: checkpoint"):
        check_resume(other, old["config"], step=1)


def test_a_model_argument_is_recorded_by_its_kind():
    from torch import nn

    from vitreg.train.model import describe

    named = describe("vit_tiny_patch16_224", {"depth": 1, "img_size": (32, 32)})
    assert named == TrainedModel(
        name="vit_tiny_patch16_224", kwargs={"depth": 1, "img_size": [32, 32]}
    )
    spec = {"base": "vit_tiny_patch16_224", "specialize": ("norm", "qkv"), "registers": 2}
    variant = describe(spec, {})
    assert isinstance(variant, TrainedVariant)
    assert variant.variant["specialize"] == "('norm', 'qkv')" and variant.variant["registers"] == 2
    assert describe(nn.Linear(2, 3), {}) == TrainedInstance(instance="Linear", params=9)


def test_recipe_options_are_one_model_with_the_recipe_defaults():
    from vitreg.errors import SpecError
    from vitreg.train.recipe import parse_options

    assert parse_options(SupervisedOptions, None, "supervised") == SupervisedOptions(
        label_smoothing=0.0, jitter=0.3
    )
    dino = parse_options(DinoOptions, {"out_dim": 64}, "dino")
    assert dino.out_dim == 64 and dino.global_scale == [0.32, 1.0]
    with pytest.raises(SpecError, match="unknown option"):
        parse_options(DinoOptions, {"outdim": 64}, "dino")
    with pytest.raises(SpecError, match="out_dim"):
        parse_options(DinoOptions, {"out_dim": "many"}, "dino")


def test_the_old_names_still_import_with_a_warning():
    import vitreg.results.train as results_train
    import vitreg.train as train_package
    import vitreg.train.config as train_config

    for module, old in (
        (results_train, "TrainConfigRecord"),
        (results_train, "TrainConfig"),
        (train_config, "TrainConfig"),
        (train_package, "TrainConfig"),
    ):
        with pytest.warns(DeprecationWarning, match="ResolvedTrainConfig"):
            assert getattr(module, old) is ResolvedTrainConfig
    with pytest.warns(DeprecationWarning, match="DinoOptions"):
        assert results_train.DinoRecipeOptions is DinoOptions
    from vitreg.train.dino import DinoOptions as from_dino

    assert from_dino is DinoOptions
