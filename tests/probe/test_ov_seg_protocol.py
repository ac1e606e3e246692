"""ov-seg's ``--protocol``: the published settings file (every entry sourced, SCLIP's equal to
the shared protocol), fitting a published crop to the model, the knobs the sliding window and
the post-processing see under each protocol (by spies on a tiny 224 px open_clip CLIP), the
leaderboard's per-row record, and the named errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError
from typer.testing import CliRunner

import vitreg
from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app
from vitreg.configs import FixConfig, ProbeRunConfig
from vitreg.data.datasets import open_dataset
from vitreg.fix.clearclip import ClearCLIP
from vitreg.fix.leaderboard import board_entry
from vitreg.fix.naclip import NACLIP
from vitreg.probe.cache import input_config
from vitreg.probe.protocols import (
    BENCHMARKS,
    UnknownBenchmarkError,
    UnknownProtocolError,
    benchmark_of,
    fitted,
    protocol_named,
    published,
    record,
)
from vitreg.probe.run import run
from vitreg.probe.tasks import ov_seg
from vitreg.probe.tasks.ov_seg import PROTOCOLS, OvSeg, protocol_names, shared_settings
from vitreg.report.render.markdown import render_markdown
from vitreg.report.renderers.leaderboard import report
from vitreg.results.leaderboard import BoardDocument, BoardResults
from vitreg.results.schema import DataInfo, utc_now, versions
from vitreg.verbs.leaderboard import with_protocol

open_clip = pytest.importorskip("open_clip")
TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 224, "layers": 1, "width": 64, "head_width": 32, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
ARCH = "vitreg-tiny-protocol-clip"
KNOBS = set(shared_settings("voc21", 224).model_fields)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def clip_model(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("open_clip_cfg")
    (folder / f"{ARCH}.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(folder)
    torch.manual_seed(0)
    return vitreg.load(f"open_clip:{ARCH}", pretrained=False)


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("templates") / "templates.txt"
    path.write_text("a photo of a {}.\n")
    return path


def _save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


@pytest.fixture(scope="module")
def voc(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two 24x32 VOC2012 images (a few classes and a boundary each)."""
    root = tmp_path_factory.mktemp("voc") / "VOC2012"
    rng = np.random.default_rng(0)
    for key in ("a", "b"):
        _save(root / "JPEGImages" / f"{key}.png", rng.integers(0, 255, (24, 32, 3), np.uint8))
        _save(root / "SegmentationClass" / f"{key}.png",
              rng.choice([0, 3, 15, 255], (24, 32)).astype(np.uint8))  # fmt: skip
    (root / "ImageSets" / "Segmentation").mkdir(parents=True)
    (root / "ImageSets" / "Segmentation" / "val.txt").write_text("a\nb\n")
    return f"voc:{root.parent}"


@pytest.fixture(scope="module")
def cityscapes(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One 16x32 Cityscapes frame with train-id labels."""
    root = tmp_path_factory.mktemp("cityscapes")
    key = "aachen_000000_000019"
    rng = np.random.default_rng(1)
    _save(root / "leftImg8bit" / "val" / "aachen" / f"{key}_leftImg8bit.png",
          rng.integers(0, 255, (16, 32, 3), np.uint8))  # fmt: skip
    _save(root / "gtFine" / "val" / "aachen" / f"{key}_gtFine_labelTrainIds.png",
          rng.choice([0, 2, 10], (16, 32)).astype(np.uint8))  # fmt: skip
    return f"cityscapes:{root}"


def _task(model, data: str, templates: Path, protocol: str) -> OvSeg:
    task = OvSeg()
    options = {"templates": templates, "protocol": protocol}
    task.setup(model, open_dataset(data, "val"), options)
    return task


def _seen(monkeypatch: pytest.MonkeyPatch, task: OvSeg, model, data: str) -> dict[str, list]:
    """What the sliding window and PAMR are called with on the first image of ``data``."""
    seen: dict[str, list] = {"windows": [], "pamr": []}
    real_windows, real_pamr = ov_seg.windows, ov_seg.pamr

    def windows(size: int, crop: int, stride: int | None = None) -> list[int]:
        seen["windows"].append((size, crop, stride))
        return real_windows(size, crop, stride)

    def pamr(image, logits, steps, dilations):
        seen["pamr"].append((steps, tuple(dilations)))
        return real_pamr(image, logits, steps, dilations)

    monkeypatch.setattr(ov_seg, "windows", windows)
    monkeypatch.setattr(ov_seg, "pamr", pamr)
    item = task.prepare(open_dataset(data, "val")[0], input_config(model))
    with torch.no_grad():
        task.outputs(model, item["image"][None], tuple(item["mask"].shape))
    seen["image"] = list(item["image"].shape[-2:])
    return seen


def test_every_method_publishes_every_benchmark_with_its_source():
    methods = published().methods
    assert set(methods) == {"sclip", "naclip", "clearclip", "sc-clip"}
    for name, method in methods.items():
        assert set(method.benchmarks) == set(BENCHMARKS), name
        for benchmark, entry in method.benchmarks.items():
            assert entry.source.startswith(f"{method.repo}@{method.commit[:7]} "), (name, benchmark)
            assert "cfg_" in entry.source  # the benchmark's own config is cited
            shared = protocol_names(shared_settings(benchmark, 224).names)
            assert len(protocol_names(entry.names)) == len(shared), (name, benchmark)


def test_sclip_publishes_the_shared_protocol():
    """The shared protocol is SCLIP's: its published entries are the shared settings."""
    for benchmark in BENCHMARKS:
        entry = published().methods["sclip"].benchmarks[benchmark]
        assert entry.model_dump(include=KNOBS) == shared_settings(benchmark, 224).model_dump()


def test_the_methods_own_settings_differ_where_their_configs_do():
    m = {k: v.benchmarks for k, v in published().methods.items()}
    clear = m["clearclip"]["voc21"]
    assert (clear.logit_scale, clear.prob_thd, clear.area_thd) == (50, 0.5, None)
    assert (clear.short_side, clear.slide_crop, clear.slide_stride) == (448, 448, 224)
    assert clear.names == "clearclip-voc21" and "vanilla" in clear.attention
    assert (m["clearclip"]["cityscapes"].slide_crop, m["clearclip"]["cityscapes"].slide_stride) == (
        224,
        224,
    )
    assert m["naclip"]["voc20"].slide_crop == 0 and m["naclip"]["ade20k"].pamr_steps == 10
    assert m["naclip"]["coco-stuff"].short_side == 336  # SCLIP's is 448
    assert (m["sc-clip"]["coco-object"].logit_scale, m["sc-clip"]["coco-object"].prob_thd) == (
        55,
        0.35,
    )


def test_a_crop_the_model_cannot_take_runs_at_its_size_with_the_published_ratio():
    entries = published().methods
    same, none = fitted(entries["clearclip"].benchmarks["cityscapes"], 224)
    assert (same.slide_crop, same.slide_stride, none) == (224, 224, [])
    big, why = fitted(entries["clearclip"].benchmarks["ade20k"], 224)
    assert (big.slide_crop, big.slide_stride) == (224, 112) and "--img-size 448" in why[0]
    whole, why = fitted(entries["naclip"].benchmarks["voc21"], 224)
    assert (whole.slide_crop, whole.slide_stride) == (224, 112) and "whole-image" in why[0]


def test_a_method_without_published_settings_keeps_the_shared_ones_and_says_so():
    shared = shared_settings("ade20k", 224)
    for method in (None, "ttr", "ttr+naclip"):
        r = record("published", method, "ade20k", shared, 224)
        assert r.method is None and r.settings == shared and r.source is None
        assert "shared protocol" in r.note
    r = record("published", "clearclip", "ade20k", shared, 224)
    assert r.method == "clearclip" and r.commit.startswith("ad68a40") and "q-q" in r.note
    assert record("shared", "clearclip", "ade20k", shared, 224).settings == shared


def test_unknown_protocol_and_benchmark_are_named_errors(clip_model, templates):
    with pytest.raises(UnknownProtocolError, match="shared or published"):
        protocol_named("paper")
    assert benchmark_of("voc") == "voc21" and benchmark_of("coco-stuff") == "coco-stuff"
    with pytest.raises(UnknownBenchmarkError, match=r"voc: \(voc21\).*ade20k:.*'synthetic-seg'"):
        _task(clip_model, "synthetic-seg:n=2,size=32", templates, "published")
    with pytest.raises(UnknownProtocolError):
        _task(clip_model, "synthetic-seg:n=2,size=32", templates, "paper")
    with pytest.raises(ValidationError, match="shared"):
        ProbeRunConfig(task="ov-seg", protocol="paper")
    with pytest.raises(ValidationError, match="other tasks take none"):
        ProbeRunConfig(task="classification", protocol="published")
    with pytest.raises(ValidationError, match="PAMR"):
        ProbeRunConfig(task="ov-seg", protocol="published", pamr=10)
    with pytest.raises(ValidationError, match="--probe ov-seg"):
        FixConfig(method="naclip,clearclip", protocol="published")


def test_shared_is_unchanged_and_published_sets_each_methods_knobs(
    clip_model, templates, cityscapes, monkeypatch
):
    shared = _task(clip_model, cityscapes, templates, "shared")
    assert shared.settings == PROTOCOLS["cityscapes"].settings() and shared.info.protocol is None
    seen = _seen(monkeypatch, shared, clip_model, cityscapes)
    assert seen["image"] == [560, 1120] and seen["pamr"] == []
    assert set(seen["windows"]) == {(560, 224, None), (1120, 224, None)}  # half stride

    task = _task(clip_model, cityscapes, templates, "published")
    assert task.info.protocol.method is None and task.short_side == 560  # unfixed: shared
    assert task.condition(ClearCLIP())[0].startswith("protocol published: clearclip's settings")
    assert task.settings["logit_scale"] == 50 and task.info.protocol.settings.slide_stride == 224
    seen = _seen(monkeypatch, task, clip_model, cityscapes)
    assert seen["image"] == [448, 896] and seen["pamr"] == []
    assert set(seen["windows"]) == {(448, 224, 224), (896, 224, 224)}  # no overlap

    note = task.condition(NACLIP())[0]
    assert "sinahmr/NACLIP@0cac3a6" in note and task.settings["logit_scale"] == 40
    seen = _seen(monkeypatch, task, clip_model, cityscapes)
    assert seen["pamr"] == [(10, (8, 16))] and (560, 224, 112) in seen["windows"]


def test_published_prompts_and_thresholds_follow_the_method(clip_model, templates, voc):
    task = _task(clip_model, voc, templates, "published")
    assert len(task.owner) > 21  # SCLIP's lists: VOC's background by 26 stuff names
    assert task.settings == {"logit_scale": 65.0, "prob_thd": 0.1, "area_thd": 0.1}
    notes = task.condition(ClearCLIP())
    assert len(task.owner) == 21 and task.k == 21  # ClearCLIP's list: one name per class
    assert task.settings == {"logit_scale": 50.0, "prob_thd": 0.5, "area_thd": None}
    assert "--img-size 448" in notes[0] and task.info.protocol.deviations


def test_the_board_records_each_rows_settings_and_source(clip_model, voc):
    rows = [board_entry("none"), board_entry("naclip", fix=NACLIP())]
    rows.append(board_entry("clearclip", fix=ClearCLIP()))
    rows.append(board_entry("sc-clip", refused="no CLIP"))
    board = with_protocol(BoardResults(n_images=2, rows=rows), "published", f"ov-seg:{voc}",
                          clip_model)  # fmt: skip
    none, naclip, clear, refused = board.rows
    assert board.protocol == "published" and refused.protocol is None
    assert none.protocol.method is None and none.protocol.settings.logit_scale == 65
    assert naclip.protocol.source.startswith("sinahmr/NACLIP@0cac3a6")
    assert naclip.protocol.settings.pamr_steps == 10 and naclip.protocol.deviations
    assert clear.protocol.settings.prob_thd == 0.5
    assert "protocol" not in BoardResults(n_images=2, rows=rows).model_dump()  # shared: unchanged
    doc = BoardDocument(**versions(), created=utc_now(), model="m", synthetic=True,
                        data=DataInfo(n_images=2), command="c", config={}, board=board)  # fmt: skip
    text = render_markdown(report(doc, []))
    assert "## Protocol" in text and "mc-lan/ClearCLIP@ad68a40" in text


def test_a_published_probe_run_records_each_conditions_protocol(clip_model, templates, voc):
    result = run(clip_model, "ov-seg", voc, fix=NACLIP(), cache_dir=Path(voc[4:]) / "cache",
                 batch_size=2, templates=templates, task_options={"protocol": "published"})  # fmt: skip
    base = result.results.conditions["base"][0]
    fixed = result.results.conditions["fixed"][0]
    assert base.info.protocol.method is None and base.info.pamr_steps == 0
    assert fixed.info.protocol.method == "naclip" and fixed.info.pamr_steps == 10
    assert fixed.info.logit_scale == 40 and fixed.info.area_thd is None
    assert any(n.startswith("protocol published: naclip's") for n in fixed.notes)
    assert not any("naclip's" in n for n in base.notes)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["probe", "planted:clip_t16", "--task", "classification", "--protocol", "published"],
         "other tasks take none"),
        (["probe", "planted:clip_t16", "--task", "ov-seg", "--protocol", "paper"], "shared"),
        (["fix", "planted:clip_t16", "--method", "naclip,sclip", "--protocol", "published"],
         "--probe ov-seg"),
    ],
)  # fmt: skip
def test_the_cli_refuses_a_protocol_it_cannot_use_before_loading(args, needle, tmp_path):
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x")])
    assert_clean_failure(result, needle)


@pytest.mark.slow  # the text tower and two passes over two images (~10 s)
def test_vitreg_probe_protocol_published_writes_each_conditions_settings(
    clip_model, templates, voc, tmp_path
):
    out = tmp_path / "run"
    args = ["probe", f"open_clip:{ARCH}", "--random-init", "--task", "ov-seg", "--data", voc]
    args += ["--fix", "clearclip", "--protocol", "published", "--templates", str(templates)]
    result = CliRunner().invoke(app, [*args, "--cache", str(tmp_path / "c"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    conditions = json.loads((out / "metrics.json").read_text())["results"]["conditions"]
    fixed = conditions["fixed"][0]["info"]
    assert fixed["protocol"]["method"] == "clearclip" and fixed["prob_thd"] == 0.5
    assert fixed["protocol"]["commit"] == published().methods["clearclip"].commit
    assert conditions["base"][0]["info"]["protocol"]["method"] is None
    assert "mc-lan/ClearCLIP@ad68a40" in (out / "report.md").read_text()
