"""``torchrun`` with two ranks writes the export one process writes: the ranks take alternate
shards of one index, and the index, the shards, the tables and the grids are the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _support.export_helpers import same_tensors, shard_tensors
from conftest import HANG_GUARD_S, free_port
from vitreg.export.index import read_index

VITREG = Path(sys.executable).with_name("vitreg")
ARGS = ["export", "planted:dinov2_s14", "--img-size", "56", "--limit", "7", "--batch-size", "3",
        "--shard-size", "2", "--layers", "4,8", "--formats", "parquet,zarr",
        "--exclude", "outliers"]  # fmt: skip


def vitreg_cli(args: list[str], ranks: int) -> None:
    cmd = [str(VITREG), *args]
    if ranks > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}"]
        cmd = [*launch, f"--master_port={free_port()}", "--no-python", *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]


@pytest.mark.slow  # two processes and one, each building the model
def test_two_ranks_write_the_export_of_one_process(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    zarr = pytest.importorskip("zarr")
    one, two = tmp_path / "one", tmp_path / "two"
    vitreg_cli([*ARGS, "--out", str(one)], ranks=1)
    vitreg_cli([*ARGS, "--out", str(two)], ranks=2)
    a, b = read_index(one), read_index(two)
    assert a is not None and a.complete and len(a.shards) == 4  # 2 + 2 + 2 + 1 images
    assert a == b
    assert same_tensors(shard_tensors(one), shard_tensors(two))
    for table in ("tokens", "images"):
        assert pq.read_table(one / table).equals(pq.read_table(two / table))
    for key in ("4", "8"):
        x = zarr.open_group(str(one / "patches.zarr"), mode="r")[key]
        y = zarr.open_group(str(two / "patches.zarr"), mode="r")[key]
        assert x.shape == y.shape == (7, 4, 4, 384) and (x[:] == y[:]).all()
    # rank 0 records every rank's files: the folder is a vitreg run that resumes as a whole
    vitreg_cli([*ARGS, "--out", str(two)], ranks=1)
    assert read_index(two) == a
