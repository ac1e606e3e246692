"""Run by tests/distributed/test_distributed_verbs.py under torchrun: ``diagnose`` with the
issue-20 analyses (sinks, massive activations, LOF, positions, registers and the per-kind
verdict) on kinds plants, sharded over the ranks and whole on each rank (``local()``).

``torchrun --nproc_per_node=2 dist_kinds_worker.py OUT`` writes ``OUT/rank<r>.pt``: per plant,
both the typed results as a dict (``DiagnoseResult.results.model_dump()``) and the image count.
"""

import sys
from pathlib import Path

import torch

import vitreg
from vitreg import distributed
from vitreg.analysis.anomaly_lof import LOFAnalysis
from vitreg.analysis.diagnose import diagnose
from vitreg.analysis.massive import MassiveAnalysis
from vitreg.analysis.norms import NormAnalysis
from vitreg.analysis.positions import PositionAnalysis
from vitreg.analysis.registers import RegisterAnalysis
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.testing.planted import build_kind

PLANTS = ("kinds_nop_sink", "kinds_position", "kinds_massive", "kinds_registers")
N_IMAGES, BATCH = 7, 3  # uneven: batches of 3, 3, 1 over 2 ranks


def analyses() -> list:
    return [
        NormAnalysis(),
        SinkAnalysis(),
        MassiveAnalysis(),
        LOFAnalysis(),
        PositionAnalysis(),
        RegisterAnalysis(),
    ]


def run(model: vitreg.Model, images: torch.Tensor) -> dict:
    res = diagnose(model, images, analyses=analyses(), batch_size=BATCH)
    return {"results": res.results.model_dump(), "n_images": res.data.n_images}


torch.set_num_threads(1)
ctx = distributed.setup()
images = torch.randn(N_IMAGES, 3, 64, 64, generator=torch.Generator().manual_seed(5))
out: dict[str, dict] = {}
for name in PLANTS:
    model = vitreg.wrap(build_kind(name)[0])
    sharded = run(model, images)
    with distributed.local():
        whole = run(model, images)
    out[name] = {"sharded": sharded, "whole": whole}
path = Path(sys.argv[1])
path.mkdir(parents=True, exist_ok=True)
torch.save(out, path / f"rank{ctx.rank}.pt")
distributed.barrier()
distributed.exit_process(0)
