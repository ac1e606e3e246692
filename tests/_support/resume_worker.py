"""Run by tests/distributed/test_distributed_resume.py under torchrun: a sharded ``Model.trace``
with every reducer kind, once whole, once killed after 4 images inside ``resumable`` and once
resumed from there.

``torchrun --nproc_per_node=2 resume_worker.py OUT`` writes ``OUT/rank<r>.pt`` with the whole and
the resumed results, and the images each resumed pass forwarded (progress calls).
"""

import sys
from pathlib import Path

import torch
from reducer_kinds import reducers, results

import vitreg
from vitreg import distributed
from vitreg.core.checkpoint import resumable
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build

N_IMAGES, BATCH, EVERY = 7, 2, 2


class Killed(Exception):
    pass


def kill(n: int) -> None:
    if n >= 4:
        raise Killed(n)


torch.set_num_threads(1)
distributed.setup()
model = vitreg.wrap(build("dinov2_s14", img_size=112)[0])
images = synthetic_images(N_IMAGES, size=112, seed=3, flat_fraction=0.1)
out = Path(sys.argv[1])
whole = model.trace(images, reducers(model), batch_size=BATCH)
try:
    with resumable(out / "resume", every=EVERY):
        model.trace(images, reducers(model), batch_size=BATCH, progress=kill)
except Killed:
    pass
seen: list[int] = []
with resumable(out / "resume", every=EVERY):
    again = model.trace(images, reducers(model), batch_size=BATCH, progress=seen.append)
torch.save(
    {"whole": results(whole), "again": results(again), "seen": seen, "n": again.n_images},
    out / f"rank{distributed.rank()}.pt",
)
distributed.exit_process(0)
