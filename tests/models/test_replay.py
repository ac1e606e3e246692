"""PrefixReplay: a pass that starts from a recorded block input equals the full pass, on every
plain family; hierarchical models and a spent budget fall back to running everything."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import vitreg
from vitreg.hooks.names import hook_name
from vitreg.models.model import Model
from vitreg.models.replay import PrefixReplay
from vitreg.testing import tiny


def _timm() -> tuple[Model, torch.Tensor]:
    module, size = tiny.timm_vit("dinov2_reg4")
    return vitreg.wrap(module), torch.randn(4, 3, size, size, generator=torch.Generator())


def _eva() -> tuple[Model, torch.Tensor]:
    return tiny.eva_model("eva02_tiny")


def _hf() -> tuple[Model, torch.Tensor]:
    pytest.importorskip("transformers")
    model = vitreg.wrap(tiny.hf_tiny("dinov2_reg"))
    size = tiny.hf_size(model)
    return model, torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(2))


def _open_clip() -> tuple[Model, torch.Tensor]:
    pytest.importorskip("open_clip")
    tower = tiny.open_clip_tower("gelu")
    return vitreg.wrap(tower), tiny.open_clip_images(tower, 4)


FAMILIES: dict[str, Callable[[], tuple[Model, torch.Tensor]]] = {
    "timm": _timm,
    "eva": _eva,
    "hf": _hf,
    "open_clip": _open_clip,
}


def _passes(model: Model, images: torch.Tensor, k: int) -> tuple[list, list, PrefixReplay]:
    """Two passes over two batches with a unit of block ``k``'s MLP zeroed: the first records
    block ``k``'s input and runs everything, the second replays it."""
    state = {"batch": 0}
    replay = PrefixReplay(model, lambda: state["batch"])

    def zero(t: torch.Tensor, hook: object) -> torch.Tensor:
        t = t.clone()
        t[..., 0] = 0
        return t

    outs: list[list[torch.Tensor]] = [[], []]
    for i, run in enumerate((replay.record([k]), None)):
        start = replay.start(k) if run is None else 0
        with model.hooks([(hook_name(k, "mlp.hook_post"), zero)]), torch.no_grad():
            with run if run is not None else replay.replay(start):
                for b, batch in enumerate(images.split(2)):
                    state["batch"] = b
                    outs[i].append(model.features(batch))
    return outs[0], outs[1], replay


@pytest.mark.parametrize("family", FAMILIES)
def test_a_replayed_pass_equals_the_full_pass(family: str) -> None:
    model, images = FAMILIES[family]()
    k = model.n_layers - 1
    full, replayed, replay = _passes(model, images, k)
    assert replay.start(k) == k and replay.start(k - 1) == 0
    for a, b in zip(full, replayed, strict=True):
        assert torch.equal(a, b)
    # the blocks are themselves again: a pass without replay runs them all
    blocks = replay.blocks
    assert blocks is not None and all("forward" not in blk.__dict__ for blk in blocks)
    with torch.no_grad():
        assert torch.equal(model.features(images[:2]), model.features(images[:2]))


def test_replayed_blocks_do_not_run() -> None:
    model, images = _timm()
    k = model.n_layers - 1
    _, _, replay = _passes(model, images, k)
    ran: list[int] = []
    hooks = [
        (hook_name(i, "mlp.hook_post"), lambda t, hook: ran.append(hook.layer))
        for i in range(model.n_layers)
    ]
    with model.hooks(hooks), torch.no_grad(), replay.replay(k):
        replay.batch = lambda: 0
        model.features(images[:2])
    assert ran == [k]


def test_hierarchical_models_and_a_spent_budget_run_everything() -> None:
    model, _ = tiny.hier_model("swin")
    replay = PrefixReplay(model, lambda: 0)
    assert replay.blocks is None
    with replay.record([1]):
        pass
    assert replay.start(1) == 0

    plain, images = _timm()
    small = PrefixReplay(plain, lambda: 0, budget_bytes=16)
    with small.record([1, 2]), torch.no_grad():
        plain.features(images[:2])
    assert small.outputs == {} and small.start(2) == 0
