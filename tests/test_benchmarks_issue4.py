"""Smoke runs of the register-neuron benchmark scripts with tiny settings (issue 4)."""

from pathlib import Path

import pytest

from bench_helpers import run_benchmark

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model=vit_small_patch16_224", "--img-size=32", "--depth=3", "--batch-size=2"]


@pytest.mark.slow
def test_discovery_speed_benchmark_smoke(tmp_path: Path) -> None:
    data = run_benchmark(
        "discovery_speed.py", tmp_path, *TINY, "--n-images=6", "--small-n-images=3", "--repeats=1"
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
