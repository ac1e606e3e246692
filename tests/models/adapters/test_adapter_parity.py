"""One parity matrix over every registered adapter: hooks that read, or rewrite a tensor with
itself, leave the source model's own forward unchanged; every site fires once per forward; and
leaving the hook scope restores the model bit for bit."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import vitreg
from conftest import images
from vitreg.models.adapters.base import ADAPTERS
from vitreg.testing.tiny import (
    EVA_MODELS,
    HF_KINDS,
    TIMM_VITS,
    eva_model,
    hf_size,
    hf_tiny,
    hier_model,
    open_clip_images,
    open_clip_tower,
    timm_vit,
)


def _timm(key: str) -> tuple[vitreg.Model, torch.Tensor]:
    module, size = timm_vit(key)
    return vitreg.wrap(module), images(2, size)


def _hf(kind: str) -> tuple[vitreg.Model, torch.Tensor]:
    model = vitreg.wrap(hf_tiny(kind))
    return model, images(2, hf_size(model))


def _open_clip(key: str) -> tuple[vitreg.Model, torch.Tensor]:
    tower = open_clip_tower(key)
    return vitreg.wrap(tower), open_clip_images(tower)


# case id -> builder of (wrapped model, two input images)
CASES: dict[str, Callable[[], tuple[vitreg.Model, torch.Tensor]]] = {
    **{f"timm-{k}": (lambda k=k: _timm(k)) for k in TIMM_VITS},
    **{f"eva-{k}": (lambda k=k: eva_model(k)) for k in EVA_MODELS},
    **{f"hier-{k}": (lambda k=k: hier_model(k)) for k in ("swin", "pvt")},
    **{f"hf-{k}": (lambda k=k: _hf(k)) for k in HF_KINDS},
    **{f"open_clip-{k}": (lambda k=k: _open_clip(k)) for k in ("gelu", "quickgelu", "clipa")},
}


def bare_forward(model: vitreg.Model, x: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor the source module's own forward returns (HF: with all hidden states)."""
    module = model.module
    with torch.no_grad():
        if model.family.startswith("hf-"):
            out = module(x, output_hidden_states=True)
            return [t for t in out.values() if isinstance(t, torch.Tensor)] + list(
                out.hidden_states
            )
        if model.family.startswith("timm-"):
            return [module.forward_features(x), module(x)]
        return [module(x)]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b)
    return max((p - q).abs().max().item() for p, q in zip(a, b, strict=True))


@pytest.mark.parametrize("case", list(CASES))
def test_hooks_leave_the_source_forward_unchanged(case: str) -> None:
    model, x = CASES[case]()
    bare = bare_forward(model, x)
    seen: list[str] = []
    with model.hooks([("*", lambda t, hook: seen.append(hook.name))]):
        read = bare_forward(model, x)
    assert max_diff(read, bare) <= 1e-5
    names = model.hook_names()
    passes = 2 if model.family.startswith("timm-") else 1  # forward_features, then the head
    assert sorted(seen) == sorted(names * passes), "every site fires once per forward"
    layers = [int(n.split(".")[1]) for n in seen[: len(names)] if n.startswith("blocks.")]
    assert layers == sorted(layers), "blocks fire in order"
    # nn.MultiheadAttention (open_clip) returns its pattern but takes no edited one back
    fixed_pattern = model.family == "open_clip-vit"
    writable = [
        n
        for n in names
        if model.site(n).writable and not (fixed_pattern and n.endswith("hook_pattern"))
    ]
    with model.hooks([(n, lambda t, hook: t * 1.0) for n in writable], attention="native"):
        rewritten = bare_forward(model, x)
    assert max_diff(rewritten, bare) <= 1e-5
    _, cache = model.run_with_cache(x)
    assert sorted(cache) == sorted(names)
    assert max_diff(bare_forward(model, x), bare) == 0.0, "the hook scope restores the model"


def test_the_matrix_covers_every_registered_adapter() -> None:
    families = {CASES[case]()[0].family for case in CASES}
    assert families == {cls.family for cls in ADAPTERS.values()}


def test_adapters_that_check_the_class_come_before_those_that_search_a_container() -> None:
    order = ADAPTERS.names()
    assert order.index("TimmViTAdapter") < order.index("HFDinov2Adapter")
    assert ADAPTERS.names("HF*") == ["HFDinov2Adapter", "HFCLIPAdapter", "HFSiglipAdapter"]
