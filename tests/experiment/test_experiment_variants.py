"""The variant experiment: grid, smallest-setting smoke run (2 variants, 2 steps), resume/skip,
traceable headlines, clear errors; every grid entry at the smallest settings."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from vitreg.errors import InputError, SpecError
from vitreg.experiment import grid, preset, run_variants
from vitreg.experiment.evaluate import probe_scores
from vitreg.experiment.record import (
    ExperimentPlan,
    ScoreSummary,
    SeedDiagnosis,
    SeedEvaluation,
    SeedRecord,
)
from vitreg.experiment.variants import open_splits
from vitreg.results.experiment import (
    DinoPresetOptions,
    ExperimentResults,
    ExperimentSettings,
    Variant,
    VariantOptions,
    VariantSummary,
)
from vitreg.results.probe import ProbeResults
from vitreg.results.schema import resolve

DATA = "synthetic:n=8,size=32"
TINIER = {
    "steps": 2,
    "batch_size": 4,
    "img_size": 32,
    "depth": 2,
    "embed_dim": 32,
    "num_heads": 2,
    "probe_epochs": 2,
    "diagnose_images": 4,
    "batch_eval": 8,
    "dino": {"out_dim": 32, "hidden_dim": 32, "bottleneck_dim": 16, "n_local_crops": 1},
}


def smoke_settings(**kw):
    return preset("tiny").with_(**{**TINIER, **kw})


def two_variants():
    return [v for v in grid() if v.name in ("baseline-none", "qkv-registers")]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run shared by the tests that only read its output."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("exp")
    return run_variants(DATA, out, smoke_settings(), variants=two_variants(), command="test")


def test_grid_is_three_specialisations_by_three_handlings_plus_gap():
    entries = grid()
    assert len(entries) == 10 and len({v.name for v in entries}) == 10
    qkv_reg = next(v for v in entries if v.name == "qkv-registers")
    assert isinstance(qkv_reg, Variant) and isinstance(qkv_reg.options, VariantOptions)
    assert qkv_reg.options == VariantOptions(specialize=["norm", "ls", "qkv"], registers=4)
    gap = entries[-1]
    assert gap.options == VariantOptions(specialize=[], pool="avg") and gap.specialisation == "gap"
    assert len(grid(include_gap=False)) == 9
    bias = [v for v in entries if v.handling == "attn_bias"]
    assert len(bias) == 3 and all(v.options.attn_bias is True for v in bias)


def test_smoke_run_writes_report_with_traceable_headlines(smoke):
    result = smoke
    assert isinstance(result.results, ExperimentResults) and result.results.complete
    assert result.document["results"] == result.results.model_dump(mode="json")
    out = result.out_dir
    for name in ("metrics.json", "report.md", "report.html", "experiment.json"):
        assert (out / name).exists(), name
    assert list((out / "figures").glob("*.png"))
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["metrics"], "no headline metrics"
    from vitreg.verbs.validate import check_run

    assert check_run(out).startswith("experiment run, schema 2.0,")
    for m in doc["metrics"]:
        assert resolve(doc, m["source"]) == pytest.approx(m["value"]), m["name"]
    names = {m["name"] for m in doc["metrics"]}
    assert {"baseline-none/seg_miou", "qkv-registers/depth_rmse"} <= names
    assert "qkv-registers/flops_delta_specialisation" in names
    report = (out / "report.md").read_text()
    assert "What can and cannot be concluded" in report and "`qkv-registers`" in report
    # the DINO loss is read against the teacher's entropy, with the measured figures
    assert "**The DINO loss** of `baseline-none`" in report and "KL(teacher ‖ student)" in report


def test_smoke_variants_differ_as_configured(smoke):
    result = smoke
    base, qkv = result.results.variants
    assert isinstance(qkv, VariantSummary)
    assert base.params.extra_total == 0
    assert qkv.params.extra["qkv"] > 0 and qkv.params.extra["registers"] > 0
    assert qkv.flops.delta.specialisation == 0
    assert len(qkv.per_block["cls_patch_post_ln1"]) == TINIER["depth"]
    assert "register_patch_post_ln1" in qkv.per_block
    for v in result.results.variants:
        run = json.loads((result.out_dir / v.folder / "seed-0" / "result.json").read_text())
        assert run["train"]["steps"] == TINIER["steps"]
        assert set(run["probes"]) == {"classification", "segmentation", "depth"}


def test_each_seed_record_holds_the_typed_evaluation(smoke):
    """result.json's probes, diagnosis and costs are the SeedEvaluation model, key for key;
    the probe scores are the last layer's base-condition scores of the full probe run."""
    for v in smoke.results.variants:
        folder = smoke.out_dir / v.folder / "seed-0"
        run = json.loads((folder / "result.json").read_text())
        part = {k: run[k] for k in ("probes", "diagnose", "params", "flops")}
        evaluation = SeedEvaluation.model_validate(part)
        assert evaluation.model_dump() == part and list(evaluation.model_dump()) == list(part)
        assert isinstance(evaluation.diagnose, SeedDiagnosis)
        assert evaluation.diagnose.verdict in ("artifacts", "no artifacts")
        full = ProbeResults.model_validate_json((folder / "probes" / "depth.json").read_text())
        scores = probe_scores(full)
        assert scores and all(isinstance(x, ScoreSummary) for x in scores.values())
        assert evaluation.probes["depth"].scores == scores


def test_rerun_reuses_complete_variants_and_rejects_other_settings(smoke):
    result = smoke
    again = run_variants(DATA, result.out_dir, smoke_settings(), variants=two_variants())
    assert all(v.reused for v in again.results.variants)
    assert [v.summary["seg_miou"] for v in again.results.variants] == [
        v.summary["seg_miou"] for v in result.results.variants
    ]
    with pytest.raises(InputError, match="other settings"):
        run_variants(DATA, result.out_dir, smoke_settings(steps=3), variants=two_variants())


def test_interrupted_experiment_continues_and_partial_report_says_so(tmp_path, monkeypatch):
    import vitreg.experiment.variants as mod

    calls = []
    real = mod.evaluate

    def flaky(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(mod, "evaluate", flaky)
    settings = smoke_settings(steps=1, probe_epochs=1)
    with pytest.raises(KeyboardInterrupt):
        run_variants(DATA, tmp_path, settings, variants=two_variants())
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["results"]["n_done"] == 1 and not doc["results"]["complete"]
    assert "partial: 1 of 2" in (tmp_path / "report.md").read_text()
    again = run_variants(DATA, tmp_path, settings, variants=two_variants())
    assert [v.reused for v in again.results.variants] == [True, False]
    assert again.results.complete
    assert len(calls) == 3  # the finished variant was not evaluated again


def test_image_folder_without_images_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="empty|no images"):
        open_splits(f"imagefolder:{tmp_path}")


def test_cli_empty_folder_exits_2(tmp_path):
    from vitreg.cli.app import app

    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(
        app, ["experiment", "variants", "--data", str(empty), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 2
    assert "empty" in res.output or "no images" in res.output


def test_bad_options_are_clear_errors(tmp_path):
    with pytest.raises(SpecError, match="unknown size"):
        preset("huge")
    with pytest.raises(SpecError, match="recipe"):
        preset("tiny", recipe="mae")
    with pytest.raises(SpecError, match="not a timm model"):
        run_variants(DATA, tmp_path, smoke_settings(), variants=[], finetune="no_such_vit")


def test_finetune_pair_converts_a_timm_model(tmp_path):
    settings = smoke_settings(steps=1, probe_epochs=1)
    result = run_variants(DATA, tmp_path, settings, variants=[], finetune="vit_tiny_patch16_224")
    names = [v.name for v in result.results.variants]
    assert names == ["finetune-baseline", "finetune-qkv"]
    base, qkv = result.results.variants
    assert base.params.extra_total == 0 and qkv.params.extra["qkv"] > 0
    assert any("random init" in n for n in qkv.notes)
    assert any("LayerScale" in n for n in qkv.notes)  # vit_tiny has none: 'ls' dropped


def test_every_grid_entry_trains_probes_and_diagnoses(tmp_path):
    """The whole grid end to end at the smallest settings (the tiny preset's wall time is
    measured by benchmarks/experiment_grid.py)."""
    result = run_variants(DATA, tmp_path, smoke_settings(steps=1, probe_epochs=1))
    assert result.results.complete
    assert [v.name for v in result.results.variants] == [v.name for v in grid()]


def test_image_folder_gets_the_classification_probe_only(tmp_path):
    from PIL import Image

    rng = torch.Generator().manual_seed(0)
    for c in ("a", "b"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(5):
            px = (torch.rand(32, 32, 3, generator=rng) * 255).to(torch.uint8).numpy()
            Image.fromarray(px).save(tmp_path / "imgs" / c / f"{i}.png")
    settings = smoke_settings(steps=1, probe_epochs=1)
    baseline = [v for v in grid() if v.name == "baseline-none"]
    result = run_variants(str(tmp_path / "imgs"), tmp_path / "out", settings, variants=baseline)
    plan = json.loads((tmp_path / "out" / "experiment.json").read_text())
    assert plan["data"].startswith("imagefolder:") and plan["tasks"] == ["classification"]
    assert set(plan["skipped_tasks"]) == {"segmentation", "depth"}
    assert result.results.variants[0].summary["seg_miou"].mean is None
    assert "Probe **segmentation** not run" in (tmp_path / "out" / "report.md").read_text()


def test_settings_are_one_typed_model_from_preset_to_metrics(smoke):
    """The preset's settings are the results' settings: experiment.json and result.json keep the
    DINO options in the order the preset gave them, metrics.json in the schema's order."""
    settings = smoke_settings()
    assert isinstance(settings, ExperimentSettings)
    assert smoke.results.settings == settings
    given = list(TINIER["dino"])
    plan = json.loads((smoke.out_dir / "experiment.json").read_text())
    assert ExperimentPlan.model_validate(plan).settings == settings
    assert list(plan["settings"]["dino"]) == given
    assert [v["name"] for v in plan["variants"]] == ["baseline-none", "qkv-registers"]
    folder = smoke.out_dir / smoke.results.variants[1].folder / "seed-0"
    record = SeedRecord.model_validate_json((folder / "result.json").read_text())
    assert record.config.settings == settings and record.config.variant == two_variants()[1]
    assert list(json.loads((folder / "result.json").read_text())["config"]["settings"]["dino"]) == (
        given
    )
    doc = json.loads((smoke.out_dir / "metrics.json").read_text())
    schema = [k for k in DinoPresetOptions.model_fields if k in given]
    assert list(doc["results"]["settings"]["dino"]) == schema != given


def test_old_names_still_work_with_a_warning():
    import vitreg.experiment as experiment

    with pytest.warns(DeprecationWarning, match="ExperimentSettings"):
        assert experiment.Settings is ExperimentSettings
    with pytest.warns(DeprecationWarning, match="model_dump"):
        assert preset("small").as_dict()["dino"] == {
            "out_dim": 1024,
            "hidden_dim": 512,
            "bottleneck_dim": 128,
            "n_local_crops": 4,
        }
    with pytest.warns(DeprecationWarning, match="model_dump"):
        assert grid()[1].as_dict()["options"] == {"specialize": [], "registers": 4}
    positional = Variant("v", {"specialize": ("norm",)}, "norm_ls", "none")
    assert positional.options.specialize == ["norm"] and positional.finetune is None


def test_a_damaged_seed_record_is_a_clear_error(smoke, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(smoke.out_dir, out)
    path = out / smoke.results.variants[1].folder / "seed-0" / "result.json"
    damaged = json.loads(path.read_text())
    del damaged["train"]["losses"]
    path.write_text(json.dumps(damaged))
    with pytest.raises(InputError, match="not a complete result"):
        run_variants(DATA, out, smoke_settings(), variants=two_variants())
