"""torchrun with 2 CPU ranks (gloo), per-rank batch 4, reproduces one process with batch 8."""

import json
import subprocess
import sys

import pytest
import torch

from _support.train_helpers import run
from conftest import HANG_GUARD_S, TESTS, free_port


def test_torchrun_two_ranks_match_one_process(tmp_path):
    script = TESTS / "_support" / "train_worker.py"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        str(script),
        "dist",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "losses.json").read_text())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the workers
    try:
        sup = run("supervised", tmp_path / "single-sup")
        dino = run("dino", tmp_path / "single-dino")
    finally:
        torch.set_num_threads(threads)
    assert got["supervised"] == pytest.approx(sup.losses, rel=1e-5)
    assert len(got["dino"]) == len(dino.history) == 4
    for key in ("loss", "loss_dino", "loss_ibot"):
        assert [r[key] for r in got["dino"]] == pytest.approx(
            [r[key] for r in dino.history], rel=1e-5
        )
    assert sup.losses[-1] < sup.losses[0]  # the runs compared actually train
