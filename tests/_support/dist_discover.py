"""Run by tests/test_distributed.py under torchrun: discovery on 2 ranks, result written by rank 0."""

import json
import sys

import torch
import torch.distributed as dist

import vitreg
from vitreg import distributed
from vitreg.neurons.discover import discover
from vitreg.settings.neurons import NeuronSearch
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build

torch.set_num_threads(1)
dist.init_process_group("gloo")
module, _ = build("deit3_s16", img_size=112)
found = discover(
    vitreg.wrap(module),
    synthetic_images(16, size=112, seed=3, flat_fraction=0.1),
    NeuronSearch(top_k=20),
    batch_size=4,
)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"pairs": found.pairs(), "scores": found.scores, "data": found.data}, f)
distributed.exit_process(0)
