"""Hooks, attention capture and the test-time-register fix on a CUDA device, in fp32 and under
bf16 autocast, against the same model on the CPU (marked ``gpu``; skipped without CUDA; run by
``benchmarks/gpu.sh``).

Stated tolerances (the CPU fp32 result is the reference):

- fp32 on CUDA: relative 1e-3 (cuDNN may use TF32 for the patch-embedding convolution, about
  10 mantissa bits) and absolute 1e-3 on attention probabilities;
- bf16 autocast: relative 5e-2 on token norms and features (8 mantissa bits, 12 blocks of
  rounding), absolute 2e-2 on attention probabilities; the planted outliers and the fix's removal
  of them are checked as outcomes, not digits.

``VITREG_TEST_DEVICE`` names another device to check the same way (``cpu`` runs these tests
against themselves, which is how the script's CPU fallback exercises them).
"""

from __future__ import annotations

import copy
import os
from contextlib import nullcontext
from typing import Any

import pytest
import torch

from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.testing.images import synthetic_images

DEVICE = os.environ.get("VITREG_TEST_DEVICE", "cuda")
_missing = DEVICE.startswith("cuda") and not torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_missing, reason="needs a CUDA device")]

TOL = {"fp32": (1e-3, 1e-3), "bf16": (5e-2, 2e-2)}  # (relative on norms/features, abs on attn)
PRECISIONS = ["fp32", "bf16"]


def autocast(precision: str) -> Any:
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    """A random-weight ViT-B/16 at 112 px on the CPU and a copy on ``DEVICE`` (4 blocks at 64 px
    when ``DEVICE`` is the CPU itself: the fallback only checks that the tests run)."""
    import vitreg

    torch.manual_seed(0)
    small = {"depth": 4, "img_size": 64} if DEVICE == "cpu" else {"img_size": 112}
    cpu = vitreg.load("timm:vit_base_patch16_224", pretrained=False, **small)
    dev = copy.deepcopy(cpu).to(DEVICE)
    return cpu, dev


@pytest.fixture(scope="module")
def planted() -> tuple[Any, Any]:
    from vitreg.models.load import load

    torch.manual_seed(0)
    cpu = load("planted:dinov2_s14", img_size=112)
    dev = copy.deepcopy(cpu).to(DEVICE)
    return cpu, dev


def images(model: Any, n: int = 4) -> torch.Tensor:
    h, _ = model.adapter.default_image_size()
    return synthetic_images(n, int(h), seed=11)


def sites(model: Any) -> list[str]:
    last = model.n_layers - 1
    return [f"blocks.{i}.hook_resid_post" for i in (0, last // 2, last)] + [
        f"blocks.{last}.mlp.hook_post"
    ]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_hooked_norms_match_the_cpu(pair: tuple[Any, Any], precision: str) -> None:
    cpu, dev = pair
    x, names = images(cpu), sites(cpu)
    ref_out, ref = cpu.run_with_cache(x, names=names, reduce="norm")
    with autocast(precision):
        out, got = dev.run_with_cache(x.to(DEVICE), names=names, reduce="norm")
        plain = dev.features(x.to(DEVICE))
    rtol = TOL[precision][0]
    for site in names:
        assert got[site].device.type == "cpu" and got[site].dtype == torch.float32
        assert rel_err(got[site], ref[site]) < rtol, site
    assert rel_err(out, ref_out) < rtol
    assert torch.allclose(out.float().cpu(), plain.float().cpu(), atol=1e-5)  # hooks change nothing


@pytest.mark.parametrize("precision", PRECISIONS)
def test_attention_capture_matches_the_cpu(pair: tuple[Any, Any], precision: str) -> None:
    cpu, dev = pair
    x = images(cpu, 2)
    names = [f"blocks.{i}.attn.hook_pattern" for i in (1, cpu.n_layers - 1)]
    _, ref = cpu.run_with_cache(x, names=names)
    with autocast(precision):
        _, got = dev.run_with_cache(x.to(DEVICE), names=names)
    for name in names:
        p = got[name].float()
        assert torch.allclose(p.sum(-1), torch.ones(()), atol=TOL[precision][1] * 5)
        assert (p - ref[name]).abs().max() < TOL[precision][1], name
        assert got.attn_source[name] == ref.attn_source[name]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_fix_matches_the_cpu_and_removes_the_outliers(
    planted: tuple[Any, Any], precision: str
) -> None:
    cpu, dev = planted
    truth = cpu.module.vitreg_planted
    ns = NeuronSet.from_pairs(truth.causal_units, cpu)
    x = images(cpu, 4)
    site = f"blocks.{cpu.n_layers - 1}.hook_resid_post"
    _, before = cpu.run_with_cache(x, names=[site], reduce="norm")
    with TestTimeRegisters(ns).applied(cpu):
        ref_out, ref = cpu.run_with_cache(x, names=[site], reduce="norm")
    with TestTimeRegisters(ns).applied(dev), autocast(precision):
        out, got = dev.run_with_cache(x.to(DEVICE), names=[site], reduce="norm")
    rtol = TOL[precision][0]
    assert rel_err(out, ref_out) < rtol
    assert rel_err(got[site], ref[site]) < rtol

    def ratio(cache: Any) -> float:  # max over median patch-token norm
        n = cache[site][:, cache.layouts[site].patches]
        return float(n.max() / n.median())

    assert ratio(before) > 3 * ratio(ref)  # the planted outliers are there before the fix
    assert ratio(got) < 1.5 * ratio(ref)  # and gone on the device as on the CPU
