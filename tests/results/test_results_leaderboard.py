"""leaderboard.json typed end to end: entries' fixes and probe scores are models, and boards
written before (unnamed fixes, ``{}`` for a refused entry, ``Model.describe()`` as it was) still
read."""

from vitreg.results.fix import ComposedDescription, LastBlockDescription
from vitreg.results.leaderboard import BoardDocument, BoardEntry

ROW = {
    "entry": "naclip",
    "part_of": [],
    "refused": None,
    "blocks_with_mode": [],
    "clean": True,
    "max_over_median": [1.5],
    "residual_max_over_median": 1.5,
    "last_block_max_over_median": 1.5,
    "pooled_cosine": {"mean": 0.9, "min": 0.8, "n": 2},
    "patch_cosine": None,
    "images_per_s": 10.0,
    "relative_speed": 0.9,
    "scores": {},
}
NACLIP = {"method": "naclip", "source": "NACLIP", "block": "last", "residual": False, "ffn": False}
SCORE = {
    "feature": "patches", "group": "all", "metric": "miou", "mean": 0.5, "ci95": 0.01,
    "values": [0.49, 0.51], "higher_is_better": True, "n_test": 4, "lrs": [0.1],
}  # fmt: skip


def test_entries_carry_typed_fixes_and_scores():
    composed = {"name": "Composed", "method": "ttr+naclip", "parts": [{"name": "naclip", **NACLIP}]}
    row = BoardEntry.model_validate(ROW | {"fix": composed, "scores": {"ov-seg miou": SCORE}})
    assert isinstance(row.fix, ComposedDescription)
    assert isinstance(row.fix.parts[0], LastBlockDescription)
    assert row.scores["ov-seg miou"].mean == 0.5


def test_boards_written_before_still_read():
    assert BoardEntry.model_validate(ROW | {"fix": {}}).fix is None
    old = BoardEntry.model_validate(ROW | {"fix": NACLIP})
    assert isinstance(old.fix, LastBlockDescription) and old.fix.name == "naclip"
    described = {"spec": "timm:x", "family": "timm_vit", "class": "VisionTransformer",
                 "n_layers": 2, "d_model": 8, "layout": {}, "notes": []}  # fmt: skip
    doc = {
        "vitreg_version": "0", "torch_version": "0", "timm_version": "0",
        "python_version": "3", "created": "2026-01-01T00:00:00+00:00",
        "model": "timm:x", "synthetic": False, "data": {"n_images": 2}, "command": "vitreg fix",
        "config": {}, "model_info": described, "board": {"n_images": 2, "rows": []},
    }  # fmt: skip
    board = BoardDocument.model_validate(doc)
    assert board.model_info is not None and board.model_info.dims["n_layers"] == 2
    assert BoardDocument.model_validate(doc | {"model_info": {}}).model_info is None
