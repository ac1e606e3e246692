"""Webdataset shards under torchrun with 2 ranks: each rank reads only its own shards (shards
``rank::2``, as webdataset's ``split_by_node``), and the merged statistics, per-image rows, image
count and skip/convert listing equal one process reading the same images from a folder -- also
under an image limit, after a kill and resume, for neuron discovery, and with fewer shards than
ranks (no split)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_distributed_verbs import same, torchrun

from conftest import TESTS

sys.path.insert(0, str(TESTS / "data"))
from test_data_wds import make_data  # noqa: E402


@pytest.mark.slow
def test_shards_split_by_rank_give_the_folder_results(tmp_path: Path) -> None:
    folder, pattern = make_data(tmp_path)  # 7 images: shard 0 keeps 2, shard 1 3, shard 2 2
    one_shard = f"wds:{tmp_path}/shard-1.tar"
    out = tmp_path / "out"
    torchrun(
        [str(TESTS / "_support" / "wds_split_worker.py"), str(out), str(folder), pattern, one_shard]
    )
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    # rank 0 reads shards 0 and 2 (images 0-1 and 5-6), rank 1 shard 1 (images 2-4)
    assert [r["indices"] for r in ranks] == [[0, 1, 5, 6], [2, 3, 4]]
    # progress: the global index past each part (batches of ceil(3 / 2) = 2, none across
    # shards), then the count of all ranks
    assert [r["progress"] for r in ranks] == [[2, 7, 7], [4, 5, 7]]
    for r in ranks:
        assert r["n"] == (7, 4, 7, 3)
        for got, want in (("split", "whole"), ("limited", "whole4"), ("again", "whole")):
            diffs = same(r[got], r[want], got)
            assert diffs == [], diffs[:10]
        assert same(r["unsplit"], r["one"], "unsplit") == []
        desc = r["description"]
        assert desc["n_images"] == 7 and list(desc["converted"]) == ["shard-1.tar/004.png"]
        assert set(desc["skipped"]) == {"shard-0.tar/002b.png", "shard-1.tar/zzz"}
        assert "not split by rank" in r["note"]
        (pairs, scores), (want_pairs, want_scores) = r["discovered"]
        assert pairs == want_pairs and same(scores, want_scores) == []
        shown, want = r["pictures"]  # the first images for figures, though rank 1 read shard 1
        assert shown.shape[0] == 4 and torch.allclose(shown, want)
    norms = ranks[0]["split"][0][3]
    assert norms["image_index"].tolist() == list(range(7))  # rows in global image order
    # killed after its first part (checkpointed there), each rank resumed from its own checkpoint
    assert [r["forwarded"] for r in ranks] == [[7, 7], [5, 7]]
