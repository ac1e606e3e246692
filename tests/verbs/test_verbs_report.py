"""render_again: a run's report rendered from its saved results is the report the run wrote
(same Markdown, same figures and captions), for every verb; a folder that holds no results is
a clear error."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import vitreg
from vitreg.configs import (
    DiagnoseConfig,
    FixConfig,
    NeuronsConfig,
    ProbeRunConfig,
    TrainRunConfig,
    VlmConfig,
)
from vitreg.errors import InputError
from vitreg.verbs.report import render_again

pytestmark = pytest.mark.usefixtures("one_thread")


def rendered_again_is_the_same(folder: Path) -> None:
    """Delete the pages a run wrote, render them again from its saved files: the same bytes."""
    names = ("report.md", "comparison.md", "leaderboard.md", "report.html")
    pages = [p for p in names if (folder / p).is_file()]
    first = {p: (folder / p).read_bytes() for p in pages}
    for p in pages:
        (folder / p).unlink()
    assert sorted(render_again(folder)) == sorted(folder / p for p in pages)
    for p in pages:
        assert (folder / p).read_bytes() == first[p], p
    assert b"data:image/webp;base64" in first["report.html"]


def planted_truth(folder: Path) -> str:
    """The planted demo model's ground-truth register neurons as a NeuronSet file."""
    from vitreg.fix.neuron_set import NeuronSet

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = vitreg.load("planted:dinov2_s14", img_size=56)
    truth = model.module.vitreg_planted.units
    return str(NeuronSet.from_pairs(truth, model).save(folder / "truth"))


def tiny_llava(folder: Path) -> VlmConfig:
    """vlm on a tiny planted LLaVA with its ground-truth register neurons, two short answers."""
    from _support.vlm_helpers import tiny_llava_with_truth

    spec, neurons = tiny_llava_with_truth(folder)
    return VlmConfig(
        spec=spec, prompt="What is in the image?", neurons=neurons, max_new_tokens=2, limit=2
    )


TINY = {"spec": "planted:dinov2_s14", "img_size": 56, "limit": 2, "batch_size": 2}
RUNS: dict[str, Callable[[Path], Any]] = {
    "diagnose": lambda tmp: DiagnoseConfig(**TINY, max_maps=1),
    "diagnose --models": lambda tmp: DiagnoseConfig(
        **{**TINY, "spec": None}, models="planted:dinov2_s14,planted:dinov2_s14_reg4", max_maps=1
    ),
    "neurons": lambda tmp: NeuronsConfig(**{**TINY, "img_size": 112, "limit": 8}),
    "fix": lambda tmp: FixConfig(**TINY, neurons=planted_truth(tmp)),
    "probe": lambda tmp: ProbeRunConfig(
        spec="planted:dinov2_s14",
        img_size=28,
        data="synthetic-cls:n=8,size=28",
        epochs=1,
        seeds=1,
    ),
    "train": lambda tmp: TrainRunConfig(
        variant="vit_tiny_patch16_224",
        data="synthetic-cls:n=8,size=32",
        steps=1,
        batch_size=4,
        img_size=32,
        model_arg=["depth=1"],
    ),
    "vlm": tiny_llava,
}


SLOW = {"diagnose --models", "neurons", "vlm"}  # two models; discovery; a LLaVA generating


@pytest.mark.parametrize(
    "verb", [pytest.param(v, marks=[pytest.mark.slow] if v in SLOW else []) for v in RUNS]
)
def test_rendered_again_is_the_report_the_run_wrote(tmp_path, cli_models, verb: str) -> None:
    """``vitreg report RUN`` writes the pages of the first rendering, byte for byte: the
    document, the saved figures and (diagnose) the saved block slider are all it needs."""
    config = RUNS[verb](tmp_path)
    run = vitreg.run(config.model_copy(update={"out": tmp_path / "run"}))
    rendered_again_is_the_same(run.run_dir)


@pytest.mark.slow  # trains and evaluates one tiny variant
def test_an_experiment_renders_again(tmp_path) -> None:
    from vitreg.experiment import grid, preset, run_variants

    settings = preset("tiny").with_(steps=1, batch_size=4, img_size=32, depth=2, embed_dim=32,
                                    num_heads=2, probe_epochs=1, diagnose_images=2, batch_eval=8)  # fmt: skip
    variants = [v for v in grid() if v.name == "baseline-none"]
    run_variants("synthetic:n=8,size=32", tmp_path, settings, variants=variants, command="t")
    rendered_again_is_the_same(tmp_path)


def test_a_fix_leaderboard_renders_again_and_validates(tmp_path) -> None:
    """``vitreg fix --method`` folders are folders like any other: `vitreg report` renders
    their pages again byte for byte, and `vitreg validate` checks leaderboard.json."""
    from vitreg.verbs.leaderboard import run_leaderboard
    from vitreg.verbs.validate import check_run

    values = {"spec": "planted:clip_t16", "method": "naclip", "img_size": 64, "limit": 2}
    run = run_leaderboard(FixConfig(**values, batch_size=2, out=tmp_path / "board"))
    rendered_again_is_the_same(run.run_dir)
    assert check_run(run.run_dir) == "fix leaderboard of 2 entries on 2 images"
    assert (run.run_dir / "leaderboard.md").read_text().startswith("**SYNTHETIC MODEL:**")


def test_a_folder_without_valid_results_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(InputError, match="holds no metrics.json"):
        render_again(tmp_path)
    (tmp_path / "metrics.json").write_text('{"verb": "diagnose"}')
    with pytest.raises(InputError, match="does not follow the schema"):
        render_again(tmp_path)
