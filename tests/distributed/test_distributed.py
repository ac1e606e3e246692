"""torchrun with 2 CPU ranks (gloo) gives the single-process register-neuron ranking."""

import json
import subprocess
import sys

import pytest
import torch

import vitreg
from conftest import HANG_GUARD_S, TESTS, free_port
from vitreg.neurons.discover import discover
from vitreg.settings.neurons import NeuronSearch
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build


@pytest.mark.slow
def test_torchrun_discovery_equals_single_process(tmp_path):
    out = tmp_path / "dist.json"
    script = TESTS / "_support" / "dist_discover.py"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        str(script),
        str(out),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(out.read_text())
    module, _ = build("deit3_s16", img_size=112)
    images = synthetic_images(16, size=112, seed=3, flat_fraction=0.1)
    single = discover(vitreg.wrap(module), images, NeuronSearch(top_k=20), batch_size=4)
    assert [tuple(p) for p in got["pairs"]] == single.pairs()
    assert torch.allclose(torch.tensor(got["scores"]), torch.tensor(single.scores), rtol=1e-6)
    assert got["data"] == single.data
