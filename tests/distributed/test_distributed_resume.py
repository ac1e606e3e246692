"""A sharded trace under torchrun with 2 ranks, killed after 4 images inside ``resumable`` and run
again: every rank resumes from the checkpoint both saved and ends with the uninterrupted result."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_distributed_verbs import same, torchrun

from conftest import TESTS


@pytest.mark.slow
def test_torchrun_trace_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    torchrun([str(TESTS / "_support" / "resume_worker.py"), str(tmp_path)])
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for r in ranks:
        assert r["n"] == 7
        diffs = same(r["again"], r["whole"], "trace")
        assert diffs == [], diffs[:10]
        assert r["seen"][0] == 6  # batches of 2: the checkpoint at 4 images, then 6 and 7
    files = sorted(p.name for p in (tmp_path / "resume").glob("*.json"))
    assert files == [f"pass-0.rank{r}.{n}.json" for r in (0, 1) for n in (6, 7)]
