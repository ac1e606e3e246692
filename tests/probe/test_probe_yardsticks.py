"""Probe yardsticks (chance, majority class, mean depth, best constant position, mean pixels,
whole-image box), Δ verdicts that call a difference better/worse only when the 95% intervals
separate, per-class IoU, and the probe figures, from the tasks to metrics.json and report.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import timm
import torch

import vitreg
from _support.saved_config import SavedConfig
from vitreg.core.intervals import interval_verdict
from vitreg.probe import yardsticks
from vitreg.probe.linear import FitSettings
from vitreg.probe.run import run
from vitreg.probe.verdicts import deltas, yardstick_verdicts
from vitreg.report.render.markdown import Report, render_markdown
from vitreg.report.renderers.probe import layer_section, write_probe_run
from vitreg.report.renderers.probe_figures import probe_figures
from vitreg.results.probe import ProbeLayer, ProbeResults, ProbeYardstick
from vitreg.results.schema import model_info

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- the yardsticks
def by_name(marks: list[ProbeYardstick]) -> dict[tuple[str, str, str], float | None]:
    return {(m.name, m.metric, m.group): m.value for m in marks}


def test_classification_chance_and_majority_from_the_train_split() -> None:
    y_train = torch.tensor([2, 2, 2, 0, 1, 2])  # class 2 most frequent in train
    y_test = torch.tensor([0, 0, 0, 2])  # ... but not in test
    marks = by_name(yardsticks.classification(y_train, y_test, 3, ("top1",)))
    assert marks[("chance", "top1", "all")] == pytest.approx(1 / 3)
    assert marks[("majority class", "top1", "all")] == pytest.approx(0.25)
    eight = by_name(yardsticks.classification(torch.arange(8), torch.arange(8), 8, ("top5",)))
    assert eight[("chance", "top5", "all")] == pytest.approx(5 / 8)
    assert eight[("majority class", "top5", "all")] == pytest.approx(5 / 8)


def test_segmentation_depth_position_reconstruction_and_discovery_baselines() -> None:
    y_train = torch.zeros(2, 4, 4, dtype=torch.long)
    y_train[:, :1] = 1  # class 0 covers 3/4 of train
    y_test = torch.zeros(1, 4, 4, dtype=torch.long)
    y_test[:, :2] = 1
    seg = by_name(yardsticks.segmentation(y_train, y_test, 2))
    assert seg[("majority class", "miou", "all")] == pytest.approx(0.25)  # IoU 0.5 and 0

    d_test = torch.tensor([[[1.0, 3.0], [float("nan"), 3.0]]])
    depth = by_name(yardsticks.depth(2.0, d_test))
    assert depth[("mean depth", "rmse", "all")] == pytest.approx(1.0)
    assert depth[("mean depth", "abs_rel", "all")] == pytest.approx((1 + 1 / 3 + 1 / 3) / 3)

    target = torch.tensor([0, 0, 0, 8])  # 3x3 grid: three tokens at the corner (0, 0)
    masks = {"all": torch.ones(4, dtype=torch.bool), "outlier": torch.tensor([0, 0, 0, 1]) > 0}
    pos = by_name(yardsticks.position(target, (3, 3), masks))
    assert pos[("chance", "top1", "all")] == pytest.approx(1 / 9)
    assert pos[("best constant", "mean_distance", "all")] == pytest.approx(math.sqrt(8) / 4)
    assert pos[("best constant", "mean_distance", "outlier")] == 0.0

    pixels_train = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    pixels_test = torch.tensor([[1.0, 3.0]])
    rec = by_name(yardsticks.reconstruction(pixels_train, pixels_test, {"all": torch.ones(1) > 0}))
    assert rec[("mean pixels", "mse", "all")] == pytest.approx(2.0)

    boxes = [torch.tensor([[0.0, 0.0, 32.0, 30.0]]), torch.tensor([[0.0, 0.0, 4.0, 4.0]])]
    whole = by_name(yardsticks.discovery(boxes, (32, 32)))
    assert whole[("whole image", "corloc", "all")] == 0.5


# ----------------------------------------------------------------------------- verdicts
def test_a_delta_is_called_only_when_the_intervals_separate() -> None:
    assert interval_verdict((0.30, 0.10), (0.39, 0.08), True) == "within noise"
    assert interval_verdict((0.30, 0.01), (0.39, 0.02), True) == "better"
    assert interval_verdict((0.30, 0.01), (0.39, 0.02), False) == "worse"  # e.g. an RMSE
    assert interval_verdict((0.30, None), (0.90, 0.01), True) == "no interval"


def layer(mean: float, ci: float) -> ProbeLayer:
    score = {"feature": "cls", "group": "all", "metric": "top1", "mean": mean, "ci95": ci,
             "values": [mean], "higher_is_better": True, "n_test": 10, "lrs": []}  # fmt: skip
    marks = [{"name": "majority class", "metric": "top1", "group": "all", "value": 0.395,
              "description": "always class 0"}]  # fmt: skip
    return ProbeLayer.model_validate(
        {
            "task": "classification",
            "layer": "blocks.0.hook_resid_post",
            "scores": [score],
            "notes": [],
            "info": {},
            "yardsticks": marks,
        }  # fmt: skip
    )


def test_report_says_within_noise_where_the_intervals_overlap() -> None:
    """The demo's case: +0.0917 with error bars of ±0.08–0.18 is within noise, and both
    conditions trail the majority class."""
    given = {"base": [layer(0.26, 0.08)], "fixed": [layer(0.3517, 0.18)]}
    conditions = {c: [yardstick_verdicts(x) for x in layers] for c, layers in given.items()}
    assert given["base"][0].scores[0].vs_yardsticks == {}  # a copy has the verdicts
    found = deltas(conditions)
    assert [d.verdict for d in found] == ["within noise"]
    assert found[0].delta == pytest.approx(0.0917)
    assert conditions["base"][0].scores[0].vs_yardsticks == {"majority class": "worse"}
    results = ProbeResults(task="classification", description="d", seeds=[0, 1], layers=[],
                           data={"train": {}, "test": {}}, conditions=conditions, deltas=found)  # fmt: skip
    text = render_markdown(Report(None, "probe", [layer_section(results, 0)]))
    assert "+0.0917 (within noise)" in text and "(better)" not in text
    assert "trails majority class" in text and "| majority class | top1 | all | 0.395 |" in text


# ----------------------------------------------------------------------------- end to end
def tiny_vit() -> vitreg.Model:
    torch.manual_seed(0)
    module = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1
    )
    return vitreg.wrap(module.eval())


def test_segmentation_run_carries_yardsticks_per_class_iou_and_figures(tmp_path: Path) -> None:
    model = tiny_vit()
    fix = vitreg.TestTimeRegisters(vitreg.NeuronSet([0], [5], [1.0]))
    result = run(model, "segmentation", "synthetic-seg:n=8,size=32", fix=fix, layers=(0,),
                 cache_dir=tmp_path / "cache", config=FitSettings(seeds=(0, 1), epochs=2))  # fmt: skip
    assert isinstance(result.results, ProbeResults)
    figures = probe_figures(result)
    assert [f.name for f in figures] == ["probe_scores", "probe_segmentation"]  # one layer
    out = tmp_path / "run"
    write_probe_run(
        out,
        result.results,
        model_info(result.model),
        SavedConfig({"task": "segmentation"}),
        "vitreg probe",
        figures,
    )
    saved = json.loads((out / "metrics.json").read_text())["results"]
    for condition in ("base", "fixed"):
        (res,) = saved["conditions"][condition]
        (mark,) = res["yardsticks"]
        assert mark["name"] == "majority class" and mark["metric"] == "miou"
        assert 0 < mark["value"] < 1
        k = res["info"]["num_classes"]
        assert [row["class"] for row in res["info"]["per_class"]] == list(range(k))
        assert set(res["scores"][0]["vs_yardsticks"]) == {"majority class"}
    (delta,) = saved["deltas"]
    assert delta["verdict"] in ("better", "worse", "within noise")
    for f in figures:
        assert (out / "figures" / f.filename).stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "IoU per class:" in report and "| class | test pixels | IoU base | IoU fixed |" in report
    assert "figures/probe_segmentation.png" in report and "Yardsticks" in report


def test_compare_between_runs_calls_a_delta_only_when_the_intervals_separate(tmp_path) -> None:
    from vitreg.report.compare import compare_runs, wide_table
    from vitreg.report.render.markdown import markdown_table

    def run_dir(name: str, scores: list[tuple[float, float | None]]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        metrics = [
            {"name": f"base/l/cls/all/top1#{i}", "value": m, "higher_is_better": True,
             "source": f"/results/conditions/base/0/scores/{i}/mean"}
            for i, (m, _) in enumerate(scores)
        ]  # fmt: skip
        listed = [{"mean": m, "ci95": c} for m, c in scores]
        doc = {"metrics": metrics, "results": {"conditions": {"base": [{"scores": listed}]}}}
        (folder / "metrics.json").write_text(json.dumps(doc))
        return folder

    first = run_dir("a", [(0.30, 0.05), (0.30, 0.01), (0.30, None), (0.30, None)])
    second = run_dir("b", [(0.39, 0.08), (0.45, 0.01), (0.90, 0.01), (0.90, None)])
    merged = compare_runs([first, second])
    assert [r.vs_first for r in merged.rows] == [
        [None, "within noise"],
        [None, "better"],
        [None, "no interval"],
        [None, None],  # plain numbers on both sides: no verdict
    ]
    assert merged.rows[0].ci95 == [0.05, 0.08]
    table = markdown_table(wide_table(merged))
    assert "0.39 ± 0.08 (within noise vs the first run)" in table
