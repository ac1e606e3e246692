"""Run by tests/test_distributed_verbs.py under torchrun: one sharded ``Model.trace`` with every
reducer kind, and the same trace whole on each rank (``local()``, the one-process path).

``torchrun --nproc_per_node=2 dist_verbs_worker.py OUT`` writes ``OUT/rank<r>.pt`` with both
results and the global image indices this rank forwarded.
"""

import sys
from pathlib import Path

import torch
from reducer_kinds import reducers, results

import vitreg
from vitreg import distributed
from vitreg.models.model import iter_batches
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build

N_IMAGES, BATCH = 7, 3  # uneven: batches of 3, 3, 1 over 2 ranks


torch.set_num_threads(1)
ctx = distributed.setup()
model = vitreg.wrap(build("dinov2_s14", img_size=112)[0])
images = synthetic_images(N_IMAGES, size=112, seed=3, flat_fraction=0.1)
seen: list[int] = []
sharded = model.trace(images, reducers(model), batch_size=BATCH, progress=seen.append)
with distributed.local():
    whole = model.trace(images, reducers(model), batch_size=BATCH)
mine = distributed.shard(iter_batches(images, BATCH)).indices()
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.save(
    {
        "sharded": results(sharded),
        "whole": results(whole),
        "n_images": (sharded.n_images, whole.n_images),
        "layouts": (sharded.layouts, whole.layouts),
        "indices": mine,
        "progress": seen,
    },
    out / f"rank{ctx.rank}.pt",
)
distributed.barrier()
distributed.exit_process(0)
