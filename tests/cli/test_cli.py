"""The ``vitreg`` command line: models, inspect, error handling, and the benchmark scripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import vitreg
from _support.bench_helpers import run_benchmark
from _support.cli_helpers import assert_clean_failure, flat
from vitreg.cli.app import app
from vitreg.cli.inspect_cmd import compress_names
from vitreg.cli.output import cli_errors
from vitreg.models.adapters.base import ADAPTERS
from vitreg.models.families import families, get_family
from vitreg.models.load import SPEC_EXAMPLES
from vitreg.verbs.loading import size_kwargs

runner = CliRunner()


def inspect_json(*args: str) -> dict:
    result = runner.invoke(app, ["inspect", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"vitreg {vitreg.__version__}"


def test_models_table_lists_every_family() -> None:
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    for fam in families():
        assert fam.key in result.stdout
        for spec in fam.examples:
            assert spec in result.stdout
    assert "QuickGELU" in flat(result.stdout)


def test_models_json() -> None:
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["key"] for r in rows] == [f.key for f in families()]
    by_key = {r["key"]: r for r in rows}
    assert by_key["dinov2"]["status"] == "ready"
    assert "timm:vit_small_patch14_reg4_dinov2.lvd142m" in by_key["dinov2"]["examples"]
    assert all(r["notes"] and r["examples"] for r in rows)


def test_families_come_from_every_adapter_and_name_known_sources() -> None:
    listed = families()
    assert {a.family for a in ADAPTERS.values()} == {f.adapter for f in listed}
    assert all(vars(a).get("families") for a in ADAPTERS.values())  # each adapter lists its own
    assert len({f.key for f in listed}) == len(listed)
    for fam in listed:
        for spec in fam.examples:
            assert spec.split(":", 1)[0] in SPEC_EXAMPLES, spec
    assert get_family("siglip").adapter == "timm-vit"
    with pytest.raises(KeyError, match="known"):
        get_family("resnet")


def test_inspect_json_layout() -> None:
    info = inspect_json("timm:vit_small_patch16_224", "--random-init", "--img-size", "64")
    assert info["family"] == "timm-vit"
    assert info["class"].endswith("VisionTransformer")
    assert (info["n_layers"], info["d_model"], info["n_heads"]) == (12, 384, 6)
    assert info["image_size"] == [64, 64]
    layout = info["layout"]
    assert (layout["n_cls"], layout["n_reg"], layout["grid"]) == (1, 0, [4, 4])
    assert layout["n_tokens"] == 17
    assert "hooks" not in info


def test_inspect_hooks_table_and_json() -> None:
    args = ["timm:vit_small_patch14_reg4_dinov2", "--random-init", "--img-size", "56", "--hooks"]
    result = runner.invoke(app, ["inspect", *args])
    assert result.exit_code == 0, result.output
    out = flat(result.stdout)
    assert "1 cls + 4 registers + 0 extra + 4x4 patches = 21 tokens" in out
    assert "blocks.{0..11}.hook_resid_post" in out
    assert "blocks.{0..11}.attn.hook_pattern" in out
    assert "blocks.0.hook_resid_post" not in out
    info = inspect_json(*args)
    assert info["hooks"][:2] == ["hook_embed", "hook_tokens"]
    assert info["hooks"][-1] == "ln_final.hook_out"
    assert len(info["hooks"]) == 3 + 12 * 11


def test_size_kwargs_per_source() -> None:
    assert size_kwargs("timm", 64, random_weights=False) == {"img_size": 64}
    assert size_kwargs("open_clip", 64, random_weights=False) == {"force_image_size": 64}
    assert size_kwargs("hf", 56, random_weights=True) == {"image_size": 56}
    assert size_kwargs("hf", 56, random_weights=False) == {}
    assert size_kwargs("timm", None, random_weights=True) == {}


def test_inspect_img_size_for_a_source_without_the_argument() -> None:
    info = inspect_json("timm:pvt_v2_b0", "--random-init", "--img-size", "64")
    assert info["family"] == "timm-hier"
    assert info["image_size"] == [64, 64]
    assert info["supports_insertion"] is False


def test_inspect_hf_tower_at_img_size() -> None:
    pytest.importorskip("transformers")
    spec = "hf:facebook/dinov2-with-registers-small"
    info = inspect_json(spec, "--random-init", "--img-size", "56")
    assert info["family"] == "hf-dinov2"
    assert (info["layout"]["n_reg"], info["layout"]["grid"]) == (4, [4, 4])


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("timm:not_a_model_xyz", "not_a_model_xyz"),
        ("nosuchsource:thing", "unknown model source"),
        ("vit_small_patch16_224", "needs a source prefix"),
    ],
)
def test_bad_spec_exits_2_without_traceback(spec: str, needle: str) -> None:
    assert_clean_failure(runner.invoke(app, ["inspect", spec]), needle)


def test_pretrained_offline_mentions_hf_hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = runner.invoke(app, ["inspect", "timm:vit_small_patch16_224.augreg_in21k_ft_in1k"])
    assert_clean_failure(result, "HF_HUB_OFFLINE", "--weights")


def test_input_errors_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.safetensors"
    spec = "timm:vit_small_patch16_224"
    assert_clean_failure(runner.invoke(app, ["inspect", spec, "--weights", str(missing)]), "exist")
    both = ["inspect", spec, "--random-init", "--weights", str(missing)]
    assert_clean_failure(runner.invoke(app, both), "exclude")
    odd = ["inspect", spec, "--random-init", "--img-size", "60"]
    assert_clean_failure(runner.invoke(app, odd), "pass a multiple of 16")


def test_missing_optional_library_message(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(typer.Exit) as exit_info, cli_errors():
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")
    assert exit_info.value.exit_code == 2
    assert "pip install 'vitreg[hf]'" in flat(capsys.readouterr().err)


def test_compress_names() -> None:
    vit = ["hook_tokens"] + [f"blocks.{i}.{s}" for i in range(3) for s in ("a", "b")] + ["ln.out"]
    assert compress_names(vit) == ["hook_tokens", "blocks.{0..2}.a", "blocks.{0..2}.b", "ln.out"]
    assert compress_names(["blocks.0.a", "blocks.2.a", "blocks.3.a"]) == ["blocks.{0,2,3}.a"]
    assert compress_names(["blocks.0.a"]) == ["blocks.0.a"]
    assert compress_names([f"b.{i}.a" for i in (0, 1, 2, 4, 6, 7)]) == ["b.{0..2,4,6,7}.a"]
    depths = (2, 2, 6)
    hier = [f"layers.{s}.blocks.{b}.x" for s, d in enumerate(depths) for b in range(d)]
    assert compress_names(hier) == ["layers.{0,1}.blocks.{0,1}.x", "layers.2.blocks.{0..5}.x"]


@pytest.mark.slow
def test_hooked_forward_benchmark_smoke(tmp_path: Path) -> None:
    tiny = ["--models=vit_small_patch16_224", "--img-size=32", "--depth=2"]
    data = run_benchmark(
        "hooked_forward.py", tmp_path, *tiny, "--batch-size=2", "--repeats=1", "--warmup=1"
    )
    (res,) = data["results"]
    assert res["model"] == "vit_small_patch16_224" and res["n_tokens"] == 5
    assert res["outputs_equal"] is True
    assert res["attn_source"] == ["recomputed"]
    assert len(res["seconds"]["plain"]) == len(res["seconds"]["hooked"]) == 1
    assert res["ratio_hooked_over_plain"] > 0
    assert data["environment"]["torch"]


@pytest.mark.slow
def test_trace_memory_benchmark_smoke(tmp_path: Path) -> None:
    tiny = ["--model=vit_small_patch16_224", "--img-size=32", "--depth=2"]
    data = run_benchmark("trace_memory.py", tmp_path, *tiny, "--n-images=3,5", "--batch-size=2")
    assert [r["n_images"] for r in data["runs"]] == [3, 5]
    assert data["runs"][1]["norms_shape"] == [5, 5]
    assert data["peak_growth_mb"] == pytest.approx(
        data["runs"][1]["peak_rss_mb"] - data["runs"][0]["peak_rss_mb"]
    )
