"""One matrix over every registered adapter, with the expected data of each case: family, token
layout, hook-name snapshot, where attention patterns come from, which sites a hook may replace,
and an input size the model refuses. Plus parity: hooks that read, or rewrite a tensor with
itself, leave the source model's own forward unchanged; every site fires once per forward; and
leaving the hook scope restores the model bit for bit. Family-specific behaviour (insertion,
q/k/v semantics, native routing) stays in the per-family files beside this one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import vitreg
from _support.hook_names import PER_BLOCK, plain_vit_names
from conftest import images
from vitreg.errors import HookError, InputError
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


#: the hook names of a Swin / PVT-v2 block (no q/k/v sites: windows and spatial reduction)
HIER_BLOCK = (
    "hook_resid_pre",
    "ln1.hook_out",
    "attn.hook_pattern",
    "hook_resid_mid",
    "ln2.hook_out",
    "mlp.hook_post",
    "hook_resid_post",
)


def hier_names(stages: int = 4, blocks: int = 2) -> list[str]:
    """Every canonical name of a 4-stage hierarchical model with 2 blocks per stage."""
    names = ["hook_embed"]
    for s in range(stages):
        names += [f"stages.{s}.blocks.{b}.{n}" for b in range(blocks) for n in HIER_BLOCK]
        names.append(f"stages.{s}.hook_out")
    return [*names, "ln_final.hook_out"]


#: snapshot kind -> the expected names of a model with ``n`` blocks
SNAPSHOTS: dict[str, Callable[[int], list[str]]] = {
    "plain": plain_vit_names,
    "plain, no ln_final": lambda n: plain_vit_names(n)[:-1],  # CLIPA: ln_post on the pooled vector
    "hier": lambda n: hier_names(),
}
OPEN_CLIP_ATTENTION = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pattern")


@dataclass(frozen=True)
class Case:
    """A model of one family and what the adapter must give for it."""

    build: Callable[[], tuple[vitreg.Model, torch.Tensor]]
    family: str
    layout: tuple[int, int, tuple[int, int]]  # n_cls, n_reg, grid after features(x)
    names: str  # a key of SNAPSHOTS
    attention: str  # where hook_pattern comes from by default: "recomputed" or "native"
    bad_size: tuple[int, int]  # an input (height, width) the model refuses ...
    bad_match: str  # ... with an InputError saying this
    read_only: tuple[str, ...] = ()  # per-block sites no hook may replace, even when native


def _vit(key: str, bad: int, match: str = "takes") -> Case:
    n_cls = 0 if key == "siglip" else 1
    n_reg = 4 if key == "dinov2_reg4" else 0
    return Case(
        lambda: _timm(key), "timm-vit", (n_cls, n_reg, (4, 4)), "plain", "recomputed",
        (bad, bad), match,
    )  # fmt: skip


def _eva(key: str, bad: int, match: str, n_reg: int = 0) -> Case:
    return Case(
        lambda: eva_model(key), "timm-eva", (1, n_reg, (4, 4)), "plain", "recomputed",
        (bad, bad), match,
    )  # fmt: skip


def _hf_case(kind: str) -> Case:
    family = "hf-" + kind.split("_")[0]
    n_cls = 0 if family == "hf-siglip" else 1
    n_reg = {"dinov2_reg": 2, "dinov2_reg_cls": 4}.get(kind, 0)  # HF's default is 4 registers
    bad, match = (
        ((49, 49), "multiple of the patch size")
        if family == "hf-dinov2"
        else ((56, 56), "interpolate_pos_encoding")
    )
    return Case(
        lambda: _hf(kind), family, (n_cls, n_reg, (3, 3)), "plain", "recomputed", bad, match
    )


CASES: dict[str, Case] = {
    "timm-dinov2": _vit("dinov2", 63, "takes 56x56"),
    "timm-dinov2_reg4": _vit("dinov2_reg4", 63),
    "timm-dinov2_swiglu": _vit("dinov2_swiglu", 63),
    "timm-clip_quickgelu": _vit("clip_quickgelu", 72, "takes 64x64"),
    "timm-siglip": _vit("siglip", 72),
    "timm-deit3": _vit("deit3", 72),
    "timm-dino": _vit("dino", 72),
    "eva-dinov3": _eva("dinov3", 60, "multiple of the patch size", n_reg=4),
    "eva-dinov3_qkvb": _eva("dinov3_qkvb", 72, "multiple of the patch size", n_reg=4),
    "eva-eva02_tiny": _eva("eva02_tiny", 70, "56x56"),
    "eva-eva02_base": _eva("eva02_base", 63, "56x56"),
    "eva-rope_mixed": _eva("rope_mixed", 72, "64x64"),
    "hier-swin": Case(
        lambda: hier_model("swin"), "timm-hier", (0, 0, (2, 2)), "hier", "native",
        (64, 64), "56x56",
    ),
    "hier-pvt": Case(  # stage 0 needs at least 8x8 tokens for its 8x8 reduction conv
        lambda: hier_model("pvt"), "timm-hier", (0, 0, (2, 2)), "hier", "recomputed",
        (16, 16), "spatial-reduction",
    ),
    **{f"hf-{k}": _hf_case(k) for k in HF_KINDS},
    "open_clip-gelu": Case(
        lambda: _open_clip("gelu"), "open_clip-vit", (1, 0, (4, 4)), "plain", "recomputed",
        (48, 48), "force_image_size", OPEN_CLIP_ATTENTION,
    ),
    "open_clip-quickgelu": Case(
        lambda: _open_clip("quickgelu"), "open_clip-vit", (1, 0, (4, 6)), "plain", "recomputed",
        (32, 32), "32x48", OPEN_CLIP_ATTENTION,
    ),
    "open_clip-clipa": Case(
        lambda: _open_clip("clipa"), "open_clip-vit", (1, 0, (4, 4)), "plain, no ln_final",
        "recomputed", (36, 36), "32x32", OPEN_CLIP_ATTENTION,
    ),
}  # fmt: skip


def test_the_cases_cover_every_builder_key() -> None:
    assert {f"timm-{k}" for k in TIMM_VITS} | {f"eva-{k}" for k in EVA_MODELS} <= set(CASES)


def _first_block(model: vitreg.Model) -> str:
    """The name prefix of the first block (``blocks.0`` or ``stages.0.blocks.0``)."""
    return next(n for n in model.hook_names() if n.endswith("hook_resid_pre")).rsplit(".", 1)[0]


@pytest.mark.parametrize("case", list(CASES))
def test_family_layout_and_features(case: str) -> None:
    c = CASES[case]
    model, x = c.build()
    assert model.family == c.family
    out = model.features(x)
    lay = model.layout
    assert (lay.n_cls, lay.n_reg, lay.grid) == c.layout
    assert out.shape == (x.shape[0], lay.n_tokens, model.d_model)


@pytest.mark.parametrize("case", list(CASES))
def test_hook_name_snapshot(case: str) -> None:
    c = CASES[case]
    model, _ = c.build()
    assert model.hook_names() == SNAPSHOTS[c.names](model.n_layers)


@pytest.mark.parametrize("case", list(CASES))
def test_attention_path(case: str) -> None:
    c = CASES[case]
    model, x = c.build()
    name = f"{_first_block(model)}.attn.hook_pattern"
    _, cache = model.run_with_cache(x, names=name)
    assert cache.attn_source[name] == c.attention
    if c.family != "timm-hier":  # windows (Swin) and reduced keys (PVT) are not n x n
        n = model.layout.n_tokens
        assert cache[name].shape[-2:] == (n, n)


@pytest.mark.parametrize("case", list(CASES))
def test_writable_sites(case: str) -> None:
    """Read-only sites refuse a replacement; so does a recomputed pattern unless routed natively."""
    c = CASES[case]
    model, x = c.build()
    block = _first_block(model)

    def zero(t: torch.Tensor, hook: object) -> torch.Tensor:
        return t * 0

    for site in c.read_only:
        with pytest.raises(HookError, match="read-only|cannot be edited"):
            model.run_with_hooks(x, [(f"{block}.{site}", zero)], attention="native")
    if c.attention == "recomputed":
        with pytest.raises(HookError, match="attention='native'|read-only|cannot be edited"):
            model.run_with_hooks(x, [(f"{block}.attn.hook_pattern", zero)])
    writable = [s for s in PER_BLOCK if f"{block}.{s}" in model.hook_names()]
    writable = [s for s in writable if s not in c.read_only]
    for site in writable:
        model.run_with_hooks(x, [(f"{block}.{site}", lambda t, hook: t * 1.0)], attention="native")


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_input_size_names_the_fix(case: str) -> None:
    c = CASES[case]
    model, _ = c.build()
    with pytest.raises(InputError, match=c.bad_match):
        model.features(torch.randn(1, 3, *c.bad_size))


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
    c = CASES[case]
    model, x = c.build()
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
    writable = [n for n in names if not n.endswith(tuple(c.read_only))]
    with model.hooks([(n, lambda t, hook: t * 1.0) for n in writable], attention="native"):
        rewritten = bare_forward(model, x)
    assert max_diff(rewritten, bare) <= 1e-5
    _, cache = model.run_with_cache(x)
    assert sorted(cache) == sorted(names)
    assert max_diff(bare_forward(model, x), bare) == 0.0, "the hook scope restores the model"


def test_the_matrix_covers_every_registered_adapter() -> None:
    families = {c.family for c in CASES.values()}
    assert families == {cls.family for cls in ADAPTERS.values()}


def test_adapters_that_check_the_class_come_before_those_that_search_a_container() -> None:
    order = ADAPTERS.names()
    assert order.index("TimmViTAdapter") < order.index("HFDinov2Adapter")
    assert ADAPTERS.names("HF*") == ["HFDinov2Adapter", "HFCLIPAdapter", "HFSiglipAdapter"]
