"""Kill-and-resume: a SIGKILLed run resumed from its checkpoint repeats the uninterrupted losses."""

import json
import subprocess
import sys

import pytest

from _support.train_helpers import run
from conftest import HANG_GUARD_S, TESTS

pytestmark = pytest.mark.usefixtures("one_thread")  # the same thread count as the killed worker


def test_sigkill_then_resume_gives_identical_losses(tmp_path):
    full = run("dino", tmp_path / "full", checkpoint_every=2)
    out = tmp_path / "killed"
    script = TESTS / "_support" / "train_worker.py"
    done = subprocess.run(
        [sys.executable, str(script), "kill", str(out), "3"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == -9, done.stderr[-2000:]  # killed after step 3, checkpoint at 2
    logged = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3]
    assert sorted(p.name for p in (out / "checkpoints").glob("*.json")) == ["step-00000002.json"]

    resumed = run("dino", out, checkpoint_every=2)
    assert resumed.resumed_from == 2
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4]  # step 3 of the killed run dropped
    assert resumed.losses == full.losses  # bit-identical, including the steps after the checkpoint
    for key in ("loss_dino", "loss_ibot"):
        assert [r[key] for r in resumed.history] == [r[key] for r in full.history]
