"""The fix leaderboard: the unfixed row first, composed entries with their parts, refusals as
rows with the reason, the measurements each row claims, and the files it writes."""

import json

import pytest
import torch

import vitreg
from vitreg.fix.leaderboard import bench_fixes, expand
from vitreg.fix.methods import FixInputs
from vitreg.fix.neuron_set import NeuronSet
from vitreg.report.renderers.leaderboard import write_leaderboard
from vitreg.results.fix import ComposedDescription
from vitreg.results.leaderboard import BoardDocument, BoardEntry, BoardResults
from vitreg.results.schema import DataInfo, utc_now, versions


def test_expand_lists_parts_before_their_composition():
    assert expand(["ttr+naclip", "sclip", "naclip"]) == {
        "ttr": ["ttr+naclip"],
        "naclip": ["ttr+naclip"],
        "ttr+naclip": [],
        "sclip": [],
    }


@pytest.mark.slow  # about 20 s on a shared CPU: five rows of norm analyses and timing
def test_board_rows_measure_each_fix_and_refuse_what_the_model_cannot_take(tmp_path):
    torch.manual_seed(0)
    m = vitreg.load(
        "timm:vit_base_patch16_clip_quickgelu_224",
        pretrained=False, depth=2, embed_dim=32, num_heads=2, img_size=32,
    )  # fmt: skip
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    inputs = FixInputs(m, NeuronSet([0], [5], [1.0]), x, batch_size=2)
    board = bench_fixes(m, ["ttr+naclip", "sc-clip"], x, inputs, batch_size=2, rounds=1)
    assert isinstance(board, BoardResults) and all(isinstance(r, BoardEntry) for r in board.rows)
    rows = {r.entry: r for r in board.rows}
    assert [r.entry for r in board.rows] == ["none", "ttr", "naclip", "ttr+naclip", "sc-clip"]
    assert "12-block" in rows["sc-clip"].refused and rows["sc-clip"].relative_speed is None
    assert rows["ttr"].part_of == ["ttr+naclip"] and rows["ttr+naclip"].part_of == []
    assert isinstance(rows["ttr+naclip"].fix, ComposedDescription)
    assert [p.name for p in rows["ttr+naclip"].fix.parts] == ["ttr", "naclip"]
    # naclip changes only the last block: every earlier block's ratio is the unfixed one
    assert rows["naclip"].max_over_median[:-1] == rows["none"].max_over_median[:-1]
    assert rows["naclip"].max_over_median[-1] != rows["none"].max_over_median[-1]
    assert rows["none"].patch_cosine is None and rows["naclip"].patch_cosine.n == 2 * 4
    assert rows["ttr"].pooled_cosine.mean > rows["naclip"].pooled_cosine.mean
    # the summary numbers are computed once, when the row is made
    assert rows["sc-clip"].clean is None
    assert rows["none"].clean is (not rows["none"].blocks_with_mode)
    assert rows["naclip"].residual_max_over_median == max(rows["naclip"].max_over_median)
    assert rows["naclip"].last_block_max_over_median == rows["naclip"].max_over_median[-1]
    assert all(r.relative_speed > 0 for r in board.rows if not r.refused)
    made = BoardDocument(**versions(), created=utc_now(), model="timm tiny", synthetic=False,
                         data=DataInfo(description="noise", n_images=2),
                         command="vitreg fix --method ttr+naclip,sc-clip", config={},
                         board=board)  # fmt: skip
    written = write_leaderboard(tmp_path, made)
    assert written is made
    doc = json.loads((tmp_path / "leaderboard.json").read_text())
    assert [r.entry for r in written.board.rows] == list(rows)
    assert [r["entry"] for r in doc["board"]["rows"]] == list(rows)
    md = (tmp_path / "leaderboard.md").read_text()
    assert "| `naclip` |" in md and "refused: SC-CLIP" in md and "## Compositions" in md
    assert (tmp_path / "figures" / "fix_leaderboard.png").stat().st_size > 0
