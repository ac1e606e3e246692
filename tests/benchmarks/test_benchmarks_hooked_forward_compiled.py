"""Smoke run of hooked_forward.py's compiled arms (``--compile``; tiny sizes, a quick backend)."""

from pathlib import Path

import pytest

from _support.bench_helpers import run_benchmark


@pytest.mark.slow
def test_compiled_arms_write_their_compile_time_apart(tmp_path: Path) -> None:
    tiny = ["--models=vit_small_patch14_dinov2@2", "--img-size=28", "--batch-size=2"]
    args = [*tiny, "--repeats=2", "--warmup=0", "--arms=kinds", "--compile=aot_eager"]
    data = run_benchmark("hooked_forward.py", tmp_path, *args, "--no-peak")
    (res,) = data["results"]
    arms = ["plain", "kinds", "plain_compiled", "kinds_compiled"]
    assert list(res["median_s"]) == arms
    assert all(res[f"ratio_{a}_over_plain"] > 0 for a in arms[1:])
    c = res["compile"]
    assert c["backend"] == "aot_eager" and set(c["compile_s"]) == set(arms[2:])
    for arm in arms[2:]:  # the first call (no warm-up asked: one is run) compiled the arm
        assert c["first_call_s"][arm] == pytest.approx(c["compile_s"][arm] + res["median_s"][arm])
    assert c["graphs"] > 0 and c["fallbacks"] == 0 and c["graphs_while_timed"] == 0
    assert c["plain_max_abs_diff"] < 1e-4
