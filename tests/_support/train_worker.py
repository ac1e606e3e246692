"""Subprocess worker for tests/test_train_distributed.py and test_train_resume.py.

``python train_worker.py kill OUT STEP``: DINO run that SIGKILLs itself after logging STEP.
``torchrun ... train_worker.py dist OUT``: supervised + DINO (accum 2) losses, written by rank 0.
"""

import json
import os
import signal
import sys

import torch
from train_helpers import AtStep, run

mode, out = sys.argv[1], sys.argv[2]
if mode == "kill":
    torch.set_num_threads(1)  # as the test's own runs: bit-identical losses need equal threads
    kill_at = int(sys.argv[3])

    def die(step):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    run("dino", out, checkpoint_every=2, progress=AtStep(die))
elif mode == "dist":
    torch.set_num_threads(1)
    sup = run("supervised", f"{out}/sup")
    dino = run("dino", f"{out}/dino", accum_steps=2)
    if int(os.environ["RANK"]) == 0:
        with open(f"{out}/losses.json", "w") as f:
            json.dump({"supervised": sup.losses, "dino": dino.history}, f)
    from vitreg import distributed

    distributed.exit_process(0)
