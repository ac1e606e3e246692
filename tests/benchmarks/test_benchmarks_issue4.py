"""Smoke runs of the register-neuron benchmark scripts with tiny settings (issue 4)."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark
from conftest import ROOT

TINY = ["--model=vit_small_patch16_224", "--img-size=32", "--depth=3", "--batch-size=2"]
# the automatic path on the planted ViT-S/14: 112 px is the smallest size the tests use
TINY_AUTO = [
    "--auto-img-size=112",
    "--auto-n-images=12",
    "--auto-small-n-images=8",
    "--auto-repeats=1",
    "--auto-warmup=0",
]


def test_discovery_speed_planted_images_are_the_same_on_every_pass(monkeypatch) -> None:
    """find_neurons reads its source several times: every pass must yield the same images."""
    import importlib

    import torch

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("discovery_speed")

    class Identity:
        def normalize(self, x: torch.Tensor) -> torch.Tensor:
            return x

    source = bench.PlantedImages(Identity(), n=5, batch_size=2, size=16, seed=1)
    first, second = list(source), list(source)
    assert len(source) == 5 and [b.shape[0] for b in first] == [2, 2, 1]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not torch.equal(first[0], first[1])  # batches differ from each other
    assert source.passes == 2 and source.made == 10


@pytest.mark.slow
def test_discovery_speed_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "discovery_speed.py",
        tmp_path,
        *TINY,
        "--n-images=6",
        "--small-n-images=3",
        "--repeats=1",
        *TINY_AUTO,
    )
    assert data["threshold"]["detect_layer"] == 1  # -2 of a 3-block model
    assert data["threshold"]["rule"] == "absolute" and data["threshold"]["value"] > 0
    assert data["searched_layers"] == [0, 1] and data["n_tokens"] == 5
    assert 1 <= data["n_images_with_outliers"] <= 6
    assert len(data["seconds"]["plain"]) == len(data["seconds"]["discover"]) == 1
    ips = data["images_per_s"]
    assert data["ratio_discover_over_plain"] == pytest.approx(ips["discover"] / ips["plain"])
    assert [r["n_images"] for r in data["memory_runs"]] == [3, 6]
    assert data["peak_rss_growth_mb"] == pytest.approx(
        data["memory_runs"][1]["peak_rss_mb"] - data["memory_runs"][0]["peak_rss_mb"]
    )
    assert data["environment"]["load_average_1m"] >= 0

    # the whole automatic path (find_neurons) on the planted model against a plain forward
    auto = data["auto"]
    assert auto["model"] == "planted:dinov2_s14" and auto["n_images"] == 12
    assert auto["img_size"] == 112 and auto["n_tokens"] == 65 and auto["warmup_error"] is None
    assert len(auto["seconds"]["plain"]) == len(auto["seconds"]["auto"]) == 1
    ips = auto["images_per_s"]
    assert ips["auto"] == pytest.approx(12 / auto["median_s"]["auto"])
    assert auto["ratio_auto_over_plain"] == pytest.approx(ips["auto"] / ips["plain"])
    assert auto["target_ratio"] == 0.5
    phases = auto["phase_median_s"]
    assert set(phases) == {"survey", "discovery", "causal", "calibration", "unlabelled"}
    assert all(v > 0 for k, v in phases.items() if k != "unlabelled")
    assert sum(phases.values()) == pytest.approx(auto["median_s"]["auto"], rel=0.05)
    assert auto["phase_labels"]["causal"].startswith("causal check")
    assert auto["causal"]["seconds"] == phases["causal"] and auto["causal"]["passes"] >= 1
    assert auto["causal"]["share_of_auto"] == pytest.approx(phases["causal"] / sum(phases.values()))
    assert auto["causal"]["n_images"] == auto["n_held_out"] == 3  # every 4th of 12
    assert auto["status"] in ("clean", "partial") and auto["chosen_pairs"]
    assert all(len(p) == 2 for p in auto["chosen_pairs"])
    # the source is read more than once: survey, discovery, held-out split
    assert auto["source"]["passes_per_auto_run"][0] >= 2
    assert auto["source"]["images_made_per_auto_run"][0] >= 24
    assert [r["n_images"] for r in auto["memory_runs"]] == [8, 12]
    assert auto["peak_rss_growth_mb"] == pytest.approx(
        auto["memory_runs"][1]["peak_rss_mb"] - auto["memory_runs"][0]["peak_rss_mb"]
    )


@pytest.mark.slow
def test_ttr_speed_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "ttr_speed.py", tmp_path, *TINY, "--repeats=2", "--warmup=1", "--layers=1-2"
    )
    assert data["fix"]["n_neurons"] == 10 and data["fix"]["n_registers"] == 1
    assert {n["layer"] for n in data["neurons"]} <= {1, 2}
    assert len({(n["layer"], n["unit"]) for n in data["neurons"]}) == 10
    assert data["n_tokens"] == {"bare": 5, "ttr_returned": 5}  # the register is stripped
    assert data["outputs_differ"] is True and data["model_left_bare"] is True
    assert len(data["seconds"]["bare"]) == len(data["seconds"]["ttr"]) == 2
    ips = data["images_per_s"]
    assert data["ratio_ttr_over_bare"] == pytest.approx(ips["ttr"] / ips["bare"])
