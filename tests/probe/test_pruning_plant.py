"""``probe --task pruning`` against the planted model whose pruning curve is known: [CLS]- and
received-attention pruning keep only sinks (chance) while k <= the sinks, SToP's sink-aware
score keeps the class signal at every keep ratio, and a fix that removes the sinks restores
[CLS]-attention pruning; bad input ends in an InputError."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch
from PIL import Image

from vitreg.data.datasets import BaseDataset, Sample
from vitreg.errors import InputError
from vitreg.fix.base import Fix
from vitreg.hooks.sites import Handle, HookContext
from vitreg.models.load import load
from vitreg.models.model import Model
from vitreg.probe.linear import FitSettings
from vitreg.probe.pruning_scores import ARMS, attention_scores, keep_count
from vitreg.probe.run import run
from vitreg.probe.tasks.pruning import ALL, keep_group
from vitreg.report.renderers.probe_figures import probe_figures
from vitreg.testing.planted.planted_pruning import SINK, PruningTruth, pruning_images

pytestmark = pytest.mark.usefixtures("one_thread")
RATIOS = (0.1, 0.2, 0.3, 0.6)
FIT = FitSettings(seeds=(0,), epochs=20, lrs=(1e-2, 1e-1))


class PlantImages(BaseDataset):
    """The plant's images as a labelled data set."""

    def __init__(self, split: str, n: int) -> None:
        super().__init__("plant-pruning", f"plant-pruning:{split}", split, ("label",))
        self.images, self.labels, self.objects = pruning_images(n, split)
        self.num_classes = 3

    def __len__(self) -> int:
        return len(self.labels)

    def _read(self, i: int) -> Sample:
        image = Image.fromarray(self.images[i])
        return Sample(image=image, key=f"{self.split}/{i}", label=int(self.labels[i]))

    def _fingerprint_parts(self) -> Iterable[Any]:
        yield ["plant-pruning", self.split, len(self)]


class RemoveSinks(Fix):
    """Zero the sink channel before the block: the plant without its sinks."""

    def apply(self, model: Model) -> Handle:
        def clear(x: torch.Tensor, hook: HookContext) -> torch.Tensor:
            x = x.clone()
            x[..., SINK] = 0
            return x

        return model.add_hook("blocks.0.hook_resid_pre", clear)


@pytest.fixture(scope="module")
def plant() -> tuple[Model, PruningTruth]:
    with pytest.warns(UserWarning, match="synthetic"):
        model = load("planted:pruning")
    return model, model.module.vitreg_pruning_truth


@pytest.fixture(scope="module")
def data() -> tuple[PlantImages, PlantImages]:
    return PlantImages("train", 96), PlantImages("val", 64)


def _means(result: Any, condition: str) -> dict[tuple[str, str], float]:
    return {(s.feature, s.group): s.mean for s in result.conditions[condition][0].scores}


def test_the_plant_ranks_sinks_then_objects_and_stop_objects_first(plant, data) -> None:
    model, truth = plant
    test = data[1]
    x = torch.stack([torch.from_numpy(test.images[i]) for i in range(32)]).permute(0, 3, 1, 2)
    x = (x.float() / 255 - 0.5) / 0.5
    name = "blocks.0.attn.hook_pattern"

    def arms(p: torch.Tensor, hook: HookContext) -> torch.Tensor:
        return torch.stack(list(attention_scores(p, hook.layout, 0.03, 1.1).values()), 1)

    _, cache = model.run_with_cache(x, names=[name], reduce=arms)
    cls, received, aware = cache[name].unbind(1)
    sinks = torch.zeros(64, dtype=torch.bool)
    sinks[truth.sinks] = True
    for scores in (cls, received):
        top = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, scores.topk(16).indices, True)
        assert (top == sinks).all()
    objects = torch.from_numpy(test.objects[:32])
    top = torch.zeros_like(aware, dtype=torch.bool).scatter_(1, aware.topk(8).indices, True)
    assert (top == objects).all()


def test_the_curves_match_the_ground_truth_with_and_without_the_fix(plant, data) -> None:
    model, truth = plant
    options = {"keep_ratios": list(RATIOS)}
    scored = run(
        model, "pruning", data, fix=RemoveSinks(), cache_dir="unused", config=FIT,
        batch_size=32, task_options=options,
    )  # fmt: skip
    result = scored.results
    layer = result.conditions["base"][0]
    assert layer.info.keep_ratios == list(RATIOS) and layer.info.patches == 64
    assert layer.info.kept_tokens == [keep_count(r, 64) for r in RATIOS]
    assert result.data.train.split == "train" and set(result.caches) == {
        "base/train", "base/test", "fixed/train", "fixed/test"
    }  # fmt: skip
    majority = max(torch.bincount(torch.from_numpy(data[1].labels)).tolist()) / 64
    base, fixed = _means(result, "base"), _means(result, "fixed")
    assert base[(ALL, "all")] >= 0.95
    for arm in ("cls-attention", "received-attention", "sink-aware"):
        for r in RATIOS:
            got = base[(arm, keep_group(r))]
            if truth.keeps_signal(arm, keep_count(r, 64)):
                assert got >= 0.95, (arm, r, got)
            else:
                assert got <= majority + 1e-6, (arm, r, got)
            assert fixed[(arm, keep_group(r))] >= 0.95, (arm, r)  # no sinks: every arm holds
    assert truth.keeps_signal("cls-attention", keep_count(0.1, 64)) is False  # the curve falls
    deltas = {(d.feature, d.group): d.delta for d in result.deltas}
    assert deltas[("cls-attention", keep_group(0.1))] > 0.5
    from vitreg.report.renderers.probe import verdict

    said = verdict(result)
    assert "; fixed, keep 10% of the patches: `" in said and " The fix (fixed − base): " in said
    assert "; largest change `cls-attention` (keep " in said or "`received-attention` (keep" in said
    (curves,) = probe_figures(scored)
    assert curves.name == "probe_pruning_curves" and curves.png.startswith(b"\x89PNG")
    drawn = curves.source.axes[0].get_legend_handles_labels()[1]
    assert drawn == [f"{c}: {a}" for c in ("base", "fixed") for a in ARMS]


def test_bad_input_is_an_input_error(plant, data, tmp_path) -> None:
    model, _ = plant
    with pytest.raises(InputError, match="keep ratio 1.5 is out of range"):
        run(model, "pruning", data, cache_dir=tmp_path, task_options={"keep_ratios": [1.5]})
    import timm

    from vitreg.models.wrapping import wrap

    no_cls = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, depth=1, class_token=False, global_pool="avg"
    )
    with pytest.raises(InputError, match="0 \\[CLS\\] tokens"):
        run(wrap(no_cls), "pruning", data, cache_dir=tmp_path)


def test_the_verdict_reads_the_smallest_keep_ratio(plant, data) -> None:
    from vitreg.report.renderers.probe import verdict

    model, _ = plant
    options = {"keep_ratios": [0.1, 0.6]}
    result = run(
        model, "pruning", data, cache_dir="unused", config=FIT, batch_size=32,
        task_options=options,
    ).results  # fmt: skip
    said = verdict(result)
    assert said.startswith("Pruning base, keep 10% of the patches: `sink-aware` 1, ")
    assert said.endswith("(all patches 1).")
    layer = result.conditions["base"][0]
    marks = {(s.feature, s.group): s.vs_yardsticks for s in layer.scores}
    assert all(set(m) == {"chance", "majority class"} for m in marks.values())  # every point
