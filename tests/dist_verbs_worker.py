"""Run by tests/test_distributed_verbs.py under torchrun: one sharded ``Model.trace`` with every
reducer kind, and the same trace whole on each rank (``local()``, the one-process path).

``torchrun --nproc_per_node=2 dist_verbs_worker.py OUT`` writes ``OUT/rank<r>.pt`` with both
results and the global image indices this rank forwarded.
"""

import sys
from pathlib import Path

import torch

import vitreg
from vitreg import distributed
from vitreg.analysis.attention import AttentionAnalysis
from vitreg.analysis.ln_separation import PairSimilarity
from vitreg.fix.compare import Pooled
from vitreg.hooks.reducers import Histogram, Max, Mean, TokenNorms, TopK
from vitreg.models.model import iter_batches
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build

N_IMAGES, BATCH = 7, 3  # uneven: batches of 3, 3, 1 over 2 ranks


def reducers(model):
    last = "blocks.11.hook_resid_post"
    return [
        TokenNorms("blocks.6.hook_resid_post"),
        TokenNorms(last, max_images=5),
        Mean(last),
        Mean(last, of="norm"),
        Mean(last, of="abs"),
        Max(last),
        Max(last, of="norm"),
        Histogram(last),
        TopK(last, k=10),
        PairSimilarity("blocks.6.hook_resid_post"),
        Pooled("ln_final.hook_out"),
        *AttentionAnalysis(max_maps=4).reducers(model)[-2:],
    ]


def results(trace):
    return [(type(r).__name__, r.site, r.n_images, r.result()) for r in trace.reducers]


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
