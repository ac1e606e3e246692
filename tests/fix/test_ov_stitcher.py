"""OV-Stitcher on a tiny random-init open_clip CLIP: one crop is the plain forward, several crops
give the source's own final block run once over the stitched tokens (a hand computation from
the tower's modules), that block attends across crops, refusals name the reason."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import vitreg
from vitreg.data.datasets import open_dataset
from vitreg.errors import UnsupportedModelError
from vitreg.fix.base import fix_description
from vitreg.fix.methods import FIXES, FixInputs
from vitreg.fix.naclip import NACLIP
from vitreg.fix.ov_stitcher import OVStitcher, active_stitcher, offsets
from vitreg.probe.tasks.ov_seg import OvSeg, windows
from vitreg.results.fix import OvStitcherDescription
from vitreg.testing.tiny import hier_model

open_clip = pytest.importorskip("open_clip")
TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
ARCH = "vitreg-tiny-stitch-clip"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def clip_model(tmp_path_factory: pytest.TempPathFactory) -> vitreg.Model:
    folder = tmp_path_factory.mktemp("open_clip_cfg")
    (folder / f"{ARCH}.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(folder)
    torch.manual_seed(0)
    return vitreg.load(f"open_clip:{ARCH}", pretrained=False)


@pytest.fixture(scope="module")
def task(clip_model, tmp_path_factory: pytest.TempPathFactory) -> OvSeg:
    path = tmp_path_factory.mktemp("templates") / "templates.txt"
    path.write_text("a photo of a {}.\n")
    t = OvSeg()
    t.setup(clip_model, open_dataset("synthetic-seg:n=2,size=32", "val"), {"templates": path})
    return t


def hand_stitched(clip_model: vitreg.Model, task: OvSeg, x: torch.Tensor) -> torch.Tensor:
    """The cosine logits of ``x`` with the tower's own last block run once over the crops'
    last-block inputs, averaged where crops overlap (read with a pre-hook on that block)."""
    visual = clip_model.module
    last = visual.transformer.resblocks[-1]
    seen: list[torch.Tensor] = []
    hook = last.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    h, w = x.shape[-2:]
    tops, lefts = windows(h, 32), windows(w, 32)
    grid = torch.zeros(x.shape[0], h // 8, w // 8, 64)
    count = torch.zeros(1, h // 8, w // 8, 1)
    cls = 0.0
    try:
        for top in tops:
            for left in lefts:
                visual(x[..., top : top + 32, left : left + 32])
                tokens = seen.pop()  # batch-first: [B, 1 + 16, 64]
                r, c = top // 8, left // 8
                grid[:, r : r + 4, c : c + 4] += tokens[:, 1:].reshape(-1, 4, 4, 64)
                count[:, r : r + 4, c : c + 4] += 1
                cls = cls + tokens[:, :1]
    finally:
        hook.remove()
    seq = torch.cat([cls / (len(tops) * len(lefts)), (grid / count).flatten(1, 2)], 1)
    out = visual.ln_post(last(seq))[:, 1:] @ visual.proj
    cos = F.normalize(out, dim=-1) @ F.normalize(task.classes, dim=-1).T
    cos = cos.transpose(1, 2).reshape(x.shape[0], -1, h // 8, w // 8)
    return F.interpolate(cos, size=(h, w), mode="bilinear")


def test_one_crop_is_the_plain_forward(clip_model, task):
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = task.logits(clip_model, x)
        with OVStitcher().applied(clip_model):
            assert active_stitcher(clip_model) is not None
            same = task.logits(clip_model, x)
        with NACLIP().applied(clip_model):
            naclip = task.logits(clip_model, x)
        with OVStitcher(final=NACLIP()).applied(clip_model):
            stitched_naclip = task.logits(clip_model, x)
    assert active_stitcher(clip_model) is None
    assert torch.equal(same, plain)
    assert torch.equal(stitched_naclip, naclip)


def test_crops_are_stitched_into_one_pass_of_the_source_final_block(clip_model, task):
    assert clip_model.module.transformer.batch_first
    x = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = hand_stitched(clip_model, task, x)
        with OVStitcher().applied(clip_model):
            got = task.logits(clip_model, x)
        plain = task.logits(clip_model, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)  # the sliding window averages logits


def test_the_final_block_attends_across_crops(clip_model, task):
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    far = x.clone()
    far[..., 48:, 48:] += 3.0  # only the bottom-right crops see these pixels
    with torch.no_grad():
        plain = task.logits(clip_model, x), task.logits(clip_model, far)
        with OVStitcher().applied(clip_model):
            stitched = task.logits(clip_model, x), task.logits(clip_model, far)
    corner = (..., slice(0, 16), slice(0, 16))  # covered by the top-left crop alone
    assert torch.equal(plain[0][corner], plain[1][corner])
    assert not torch.allclose(stitched[0][corner], stitched[1][corner], atol=1e-6)


def test_a_different_final_block_is_used_on_the_stitched_tokens(clip_model, task):
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        with OVStitcher().applied(clip_model):
            own = task.logits(clip_model, x)
        with OVStitcher(final=NACLIP()).applied(clip_model):
            naclip = task.logits(clip_model, x)
    assert not torch.allclose(own, naclip, atol=1e-3)


def test_crop_offsets_land_on_the_nearest_patch_row():
    assert offsets([0, 112, 224], 16) == [0, 7, 14]
    assert offsets([0, 76], 16) == [0, 5]  # 76 px = 4.75 patches: the crop's tokens go to row 5


def test_models_without_a_plain_final_block_are_refused(clip_model):
    swin, _ = hier_model("swin")
    with pytest.raises(UnsupportedModelError, match="windows or stages"):
        OVStitcher().apply(swin)
    assert active_stitcher(swin) is None


def test_registered_and_described(clip_model):
    fix = FIXES.build("ov-stitcher", FixInputs(clip_model))
    assert isinstance(fix, OVStitcher) and FIXES["ov-stitcher"].last_block
    said = fix_description(fix)
    assert isinstance(said, OvStitcherDescription) and said.final_block == "own"
    assert fix_description(OVStitcher(final=NACLIP())).final_block == "naclip"


def test_the_leaderboard_lists_both_methods(clip_model):
    from vitreg.fix.leaderboard import bench_fixes

    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    board = bench_fixes(
        clip_model, ["ov-stitcher", "rf-clip"], x, FixInputs(clip_model), batch_size=2, rounds=1
    )
    rows = {r.entry: r for r in board.rows}
    assert list(rows) == ["none", "ov-stitcher", "rf-clip"]
    # one crop per image: the stitched final block is the model's own
    assert rows["ov-stitcher"].patch_cosine.min > 0.9999
    assert rows["ov-stitcher"].fix.method == "ov-stitcher"
    assert "768 wide" in rows["rf-clip"].refused  # the published channels are ViT-B/16's
