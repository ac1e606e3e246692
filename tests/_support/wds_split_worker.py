"""Run by tests/distributed/test_distributed_wds.py under torchrun: traces of webdataset shards
split by rank (every reducer kind, an image limit, a run killed and resumed) and neuron
discovery, beside the same images read from a folder by one process.

``torchrun --nproc_per_node=2 wds_split_worker.py OUT FOLDER PATTERN ONE_SHARD`` writes
``OUT/rank<r>.pt``.
"""

import sys
from pathlib import Path

import torch
from reducer_kinds import reducers, results

import vitreg
from vitreg import distributed
from vitreg.core.checkpoint import resumable
from vitreg.data.images import folder_images
from vitreg.data.wds import wds_images
from vitreg.neurons.discover import discover
from vitreg.settings.neurons import NeuronSearch
from vitreg.testing.planted import build

BATCH = 3


class Killed(Exception):
    pass


def kill(n: int) -> None:
    raise Killed(n)  # after this rank's first part


torch.set_num_threads(1)
distributed.setup()
out, folder, pattern, one_shard = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
model = vitreg.wrap(build("dinov2_s14", img_size=112)[0])
shards = wds_images(model, pattern, BATCH, keep=4)
seen: list[int] = []
split = model.trace(shards, reducers(model), batch_size=BATCH, progress=seen.append)
indices = distributed.split(shards).indices()
limited = model.trace(wds_images(model, pattern, BATCH, limit=4), reducers(model))
try:
    with resumable(out / "resume", every=1):
        model.trace(wds_images(model, pattern, BATCH), reducers(model), progress=kill)
except Killed:
    pass
forwarded: list[int] = []
with resumable(out / "resume", every=1):
    again = model.trace(
        wds_images(model, pattern, BATCH), reducers(model), progress=forwarded.append
    )
found = discover(model, wds_images(model, pattern, BATCH), NeuronSearch(top_k=10), batch_size=BATCH)
single = wds_images(model, one_shard, BATCH)
unsplit = model.trace(single, reducers(model))
pictures = folder_images(model, folder, BATCH, keep=4)
with distributed.local():  # one process' results, from the folder
    whole = model.trace(pictures, reducers(model))
    whole4 = model.trace(folder_images(model, folder, BATCH, limit=4), reducers(model))
    one = model.trace(wds_images(model, one_shard, BATCH), reducers(model))
    pictures_all = folder_images(model, folder, BATCH)
    found_whole = discover(model, pictures_all, NeuronSearch(top_k=10), batch_size=BATCH)
torch.save(
    {
        "split": results(split),
        "whole": results(whole),
        "limited": results(limited),
        "whole4": results(whole4),
        "again": results(again),
        "unsplit": results(unsplit),
        "one": results(one),
        "n": (split.n_images, limited.n_images, again.n_images, unsplit.n_images),
        "indices": indices,
        "progress": seen,
        "forwarded": forwarded,
        "description": shards.description().model_dump(),
        "note": single.split_note(distributed.world()),
        "discovered": [(f.pairs(), f.scores) for f in (found, found_whole)],
        "pictures": (shards.display_images(), pictures.display_images()),
    },
    out / f"rank{distributed.rank()}.pt",
)
distributed.exit_process(0)
