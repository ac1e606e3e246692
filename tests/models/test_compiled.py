"""The compiled forward (``Model.compile``): the same statistics as the eager forward, hooks that
change after compiling still fire, and a backend that fails is a counted fallback, not a
traceback from inside dynamo."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch._dynamo

import vitreg
from vitreg.errors import HookError
from vitreg.models.compiled import CompileError, check_backend

DEBUG = "aot_eager"  # traces and partitions like inductor, runs torch's own kernels: quick


def tiny() -> vitreg.Model:
    torch.manual_seed(0)
    return vitreg.load("timm:vit_small_patch14_dinov2", pretrained=False, img_size=56, depth=2)


def differences(a: Any, b: Any, path: str = "", rtol: float = 1e-4) -> list[str]:
    """Paths where two JSON documents differ (numbers compared to ``rtol``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}", rtol)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{path}[{i}]", rtol)]
    if float in (type(a), type(b)) and {type(a), type(b)} <= {int, float}:
        close = math.isclose(a, b, rel_tol=rtol, abs_tol=1e-6) or (math.isnan(a) and math.isnan(b))
        return [] if close else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def diagnosed(backend: str | None) -> dict[str, Any]:
    from vitreg.analysis.diagnose import diagnose
    from vitreg.testing import synthetic_pil

    model = vitreg.load("planted:dinov2_s14", img_size=56)
    images = model.preprocess(synthetic_pil(6, 56))
    if backend is None:
        return diagnose(model, images, batch_size=4).results.model_dump(mode="json")
    with model.compile(backend) as compiled:
        result = diagnose(model, images, batch_size=4)  # 4 then 2 images: a second shape
    assert compiled.report.calls >= 2 and compiled.report.graphs > 0
    assert compiled.report.fallbacks == 0, compiled.report.reasons
    return result.results.model_dump(mode="json")


def backend_or_skip(backend: str) -> None:
    try:
        check_backend(backend, torch.device("cpu"))
    except CompileError as e:
        pytest.skip(f"{backend} cannot run on this machine: {e}")


def test_diagnose_compiled_gives_every_field_of_the_eager_results() -> None:
    assert differences(diagnosed(DEBUG), diagnosed(None)) == []


@pytest.mark.slow
def test_diagnose_compiled_by_inductor_gives_every_field_of_the_eager_results() -> None:
    backend_or_skip("inductor")
    assert differences(diagnosed("inductor"), diagnosed(None)) == []


def test_hooks_attached_after_compiling_fire_and_removed_ones_do_not() -> None:
    model, x = tiny(), torch.randn(2, 3, 56, 56)
    _, eager = model.run_with_cache(x, names="blocks.*.hook_resid_post")
    seen: list[str] = []
    with model.compile(DEBUG):
        with model.hooks([("blocks.0.hook_resid_post", lambda t, h: seen.append(h.name))]):
            model.features(x)
        assert seen == ["blocks.0.hook_resid_post"]
        model.features(x)  # the hook is gone: it must not fire from a compiled graph
        assert seen == ["blocks.0.hook_resid_post"]
        _, cache = model.run_with_cache(x, names="blocks.*.hook_resid_post")
        _, patterns = model.run_with_cache(x, names="blocks.1.attn.hook_pattern")
    assert list(cache.keys()) == list(eager.keys())
    for name in eager.keys():
        torch.testing.assert_close(cache[name], eager[name], rtol=1e-5, atol=1e-6)
    _, eager_patterns = model.run_with_cache(x, names="blocks.1.attn.hook_pattern")
    name = "blocks.1.attn.hook_pattern"
    torch.testing.assert_close(patterns[name], eager_patterns[name], rtol=1e-5, atol=1e-6)


def test_a_hook_that_edits_and_stop_at_layer_work_compiled() -> None:
    model, x = tiny(), torch.randn(2, 3, 56, 56)

    def double(t: torch.Tensor, hook: Any) -> torch.Tensor:
        return 2 * t

    edit = [("blocks.0.hook_resid_post", double)]
    eager = model.run_with_hooks(x, edit)
    stopped = model.features(x, stop_at_layer=1)
    with model.compile(DEBUG):
        torch.testing.assert_close(model.run_with_hooks(x, edit), eager, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.features(x, stop_at_layer=1), stopped)


def test_removing_the_compiled_forward_puts_hooks_and_attention_back() -> None:
    model, x = tiny(), torch.randn(2, 3, 56, 56)
    attn = model.module.blocks[1].attn
    with model.hooks([("blocks.1.attn.hook_pattern", lambda t, h: None)]) as handle:
        hooks = dict(attn.k_norm._forward_hooks)
        with model.compile(DEBUG) as compiled:
            assert model.compiled is compiled
            model.features(x)
            assert "forward" in attn.__dict__  # carries a hook: runs eagerly as a whole
        assert model.compiled is None
        assert "forward" not in attn.__dict__
        assert dict(attn.k_norm._forward_hooks) == hooks
    handle.remove()


def test_a_backend_that_fails_is_a_counted_fallback_with_its_reason(capfd) -> None:
    def broken(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        raise RuntimeError("no kernels today")

    model, x = tiny(), torch.randn(2, 3, 56, 56)
    torch._dynamo.reset()  # frames compiled by earlier tests would not be compiled again
    eager = model.features(x)
    with model.compile(broken) as compiled:
        out = model.features(x)
    torch.testing.assert_close(out, eager)
    report = compiled.report
    assert report.fallbacks > 0 and report.graphs == 0
    assert any("no kernels today" in r for r in report.reasons), report.reasons
    assert "no kernels today" in report.summary()
    assert "Traceback" not in capfd.readouterr().err


def test_a_backend_that_cannot_run_is_a_named_error() -> None:
    model = tiny()
    with pytest.raises(CompileError, match="no backend 'no-such-backend'"):
        model.compile("no-such-backend")
    assert model.compiled is None
    with model.compile(DEBUG), pytest.raises(HookError, match="already compiled"):
        model.compile(DEBUG)


def test_diagnose_compile_option_runs_compiled_and_says_so(tmp_path, monkeypatch) -> None:
    import yaml
    from typer.testing import CliRunner

    from vitreg.cli.app import app
    from vitreg.models import compiled

    monkeypatch.setattr(compiled, "DEFAULT_BACKEND", DEBUG)
    out = tmp_path / "run"
    args = ["diagnose", "planted:dinov2_s14", "--img-size", "56", "--limit", "4", "--compile"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"compiled forward ({DEBUG}):" in text and "graphs" in text
    assert yaml.safe_load((out / "config.yaml").read_text())["compile"] is True
    assert "--compile" in (out / "report.md").read_text()


def test_diagnose_compile_with_a_backend_that_cannot_run_fails_cleanly(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from _support.cli_helpers import assert_clean_failure
    from vitreg.cli.app import app
    from vitreg.models import compiled

    monkeypatch.setattr(compiled, "DEFAULT_BACKEND", "no-such-backend")
    args = ["diagnose", "planted:dinov2_s14", "--img-size", "56", "--limit", "2", "--compile"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert_clean_failure(result, "no backend 'no-such-backend'")
    assert not (tmp_path / "run" / "metrics.json").exists()


def family_model(key: str) -> tuple[vitreg.Model, torch.Tensor]:
    """A tiny model of each adapter family and two images of its size."""
    from vitreg.testing import tiny

    source, name = key.split(":")
    if source == "eva":
        return tiny.eva_model(name)
    if source == "hier":
        return tiny.hier_model(name)
    if source == "hf":
        pytest.importorskip("transformers")
        model = vitreg.Model(tiny.hf_tiny(name))
        return model, torch.rand(2, 3, tiny.hf_size(model), tiny.hf_size(model))
    pytest.importorskip("open_clip")
    tower = tiny.open_clip_tower(name)
    return vitreg.Model(tower), tiny.open_clip_images(tower)


SLOW = pytest.mark.slow  # a minute of compiling: every stage's blocks have their own code
FAMILIES = [
    "eva:dinov3",
    "hf:dinov2_reg",
    "open_clip:gelu",
    pytest.param("hier:swin", marks=SLOW),
    pytest.param("hier:pvt", marks=SLOW),
]


@pytest.mark.parametrize("key", FAMILIES)
def test_every_family_compiles_with_the_eager_patterns_and_residuals(key: str) -> None:
    model, x = family_model(key)
    names = [n for n in model.hook_names() if n.endswith(("hook_pattern", "hook_resid_post"))]
    _, eager = model.run_with_cache(x, names=names)
    with model.compile(DEBUG) as compiled:
        _, cache = model.run_with_cache(x, names=names)
    assert compiled.report.fallbacks == 0, compiled.report.reasons
    for name in names:
        torch.testing.assert_close(cache[name], eager[name], rtol=1e-5, atol=1e-6)
