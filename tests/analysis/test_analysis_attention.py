"""Attention artifacts: maps, sinks and attention/norm agreement on planted, plain and
hierarchical models, and exact numbers on hand-made patterns."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import window_partition

import vitreg
from vitreg.analysis.attention import (
    AttentionAnalysis,
    AttentionMaps,
    agreement,
    artifact_masks,
)
from vitreg.analysis.base import run_analyses
from vitreg.analysis.norms import NormAnalysis
from vitreg.core.layout import TokenLayout
from vitreg.hooks.patterns import read_global
from vitreg.hooks.sites import HookContext
from vitreg.results.diagnose import Attention
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build, build_unplanted

SIZE = 112  # 8x8 patches of 14 px
N_IMAGES = 16


def _run(module_or_model, x, analyses, batch_size=16):
    model = module_or_model
    if not isinstance(model, vitreg.Model):
        model = vitreg.wrap(module_or_model)
    results, skipped, _ = run_analyses(model, x, analyses, batch_size=batch_size)
    return model, results, skipped


@pytest.fixture(scope="module")
def planted():
    """dinov2_s14 planted and unplanted on the same images: (truth, images, planted, unplanted)."""
    x = synthetic_images(N_IMAGES, size=SIZE, seed=1, flat_fraction=0.1)
    module, truth = build("dinov2_s14", img_size=SIZE)
    analyses = [NormAnalysis(), AttentionAnalysis(max_maps=N_IMAGES)]
    _, res, _ = _run(module, x, analyses)
    _, ctrl, _ = _run(build_unplanted("dinov2_s14", img_size=SIZE), x, analyses)
    return truth, x, res, ctrl


# hand-made cases -------------------------------------------------------------------------
def _feed(reducer, pattern, layout, offset=0):
    reducer(pattern, HookContext("blocks.0.attn.hook_pattern", 0, layout), offset)
    return reducer


def test_hand_made_cls_row_topk_entropy_and_map():
    layout = TokenLayout(1, 0, (2, 2), (14, 14))  # [CLS] + 4 patches
    p = torch.full((1, 2, 5, 5), 0.2)
    p[0, 0, 0] = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1])  # head 0: a sink on patch 0
    reader = lambda t, lay: read_global(t, lay, "cls")  # noqa: E731
    res = _feed(AttentionMaps("s", reader, ks=(1, 2, 5), keep_heads=1), p, layout).result()
    assert res["top"][1].item() == pytest.approx((0.6 + 0.2) / 2)
    assert res["top"][2].item() == pytest.approx((0.7 + 0.4) / 2)
    assert res["top"][5].item() == pytest.approx(1.0)  # k = every key
    h0 = -(0.6 * math.log(0.6) + 4 * 0.1 * math.log(0.1))
    assert res["entropy"].item() == pytest.approx((h0 + math.log(5)) / 2, rel=1e-6)
    assert torch.allclose(res["map"], torch.tensor([[0.4, 0.15, 0.15, 0.15]]))
    assert res["max"].item() == pytest.approx(0.4)
    assert res["heads"].shape == (1, 2, 2, 2) and res["grid"] == (2, 2) and res["n_keys"] == 5
    assert res["heads"][0, 0, 0, 0].item() == pytest.approx(0.6)


def test_hand_made_mean_received_and_streaming_merge():
    layout = TokenLayout(0, 0, (1, 3), (16, 16))
    rows = torch.tensor([[0.5, 0.25, 0.25], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
    p = rows.expand(2, 1, 3, 3).clone()
    p[1] = rows.flip(-1)
    reader = lambda t, lay: read_global(t, lay, "mean_received")  # noqa: E731
    res = _feed(AttentionMaps("s", reader, ks=(1,)), p, layout).result()
    want = rows.mean(0)
    assert torch.allclose(res["map"][0], want) and torch.allclose(res["map"][1], want.flip(-1))
    assert res["top"][1][0].item() == pytest.approx((0.5 + 1.0 + 0.5) / 3)  # every query, averaged
    ent = (-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)) + 0.0 + math.log(2)) / 3
    assert res["entropy"][0].item() == pytest.approx(ent, rel=1e-6)
    # two reducers on disjoint images (one far past the initial buffer) merge into one answer
    a = _feed(AttentionMaps("s", reader), p[:1], layout, 0)
    b = _feed(AttentionMaps("s", reader), p[1:], layout, 100)
    a.merge(b)
    merged = a.result()
    assert merged["map"].shape == (2, 3) and torch.allclose(merged["map"], res["map"])
    assert a.n_images == 101


def test_artifact_rule_and_agreement_numbers():
    logs = torch.tensor(
        [0.0] * 8 + [1.0] * 7 + [10.0]
    )  # median 0.5, MAD 0.5: cut 0.5 + 3.5 * 0.741
    maps = torch.stack([logs.exp(), torch.ones(16)]).view(2, 4, 4)
    art = artifact_masks(maps)
    assert art[0].flatten().tolist() == [False] * 15 + [True] and not art[1].any()
    spike = torch.ones(16)
    spike[3] = 50.0  # MAD 0: the mean-absolute-deviation fallback still finds the spike
    assert artifact_masks(spike.view(1, 4, 4)).flatten().nonzero().flatten().tolist() == [3]
    a = torch.tensor([[True, True, True, False], [False, False, False, False]])
    n = torch.tensor([[True, True, False, True], [False, False, False, True]])
    got = agreement(a, n)
    assert got["precision"] == pytest.approx(2 / 3) and got["recall"] == pytest.approx(2 / 4)
    assert got["iou"] == pytest.approx(2 / 5) and got["overlap"] == pytest.approx(2 / 3)
    assert (got["n_attention"], got["n_norm"], got["n_both"]) == (3, 4, 2)
    empty = agreement(torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool))
    assert empty["precision"] is None and empty["recall"] is None and empty["iou"] is None


# planted fixtures ------------------------------------------------------------------------
def test_planted_cls_attention_concentrates_on_outliers_and_agrees_with_norms(planted):
    truth, x, res, _ = planted
    a = res["attention"]
    assert a.summary.query == "cls" and a.summary.norm_method == "auto"
    source = a.summary.attention_source
    assert set([source] if isinstance(source, str) else source) <= {"native", "recomputed"}
    assert len(a.summary.sites) == 12
    assert a.maps.shape == (N_IMAGES, 12, 8, 8) and a.last_layer_heads.shape == (N_IMAGES, 6, 8, 8)
    want = truth.outlier_mask(x).float()
    share = want.mean().item()
    mass = [(a.maps[:, i] * want).sum().item() / a.maps[:, i].sum().item() for i in range(12)]
    for layer in truth.sink_layers:  # [CLS] mass on ~8% of patches: 4x their share or more
        assert mass[layer] > 4 * share, (layer, mass)
    for layer in range(truth.first_outlier_layer):
        assert mass[layer] < 2 * share, (layer, mass)
        assert a.summary.agreement[layer].n_norm == 0  # no norm outliers yet under "auto"
    for layer in truth.sink_layers:
        ag = a.summary.agreement[layer]
        assert ag.norm_method == "auto" and ag.n_norm > 0 and ag.n_attention > 0
        assert ag.precision >= 0.8, (layer, ag)
    first = a.summary.agreement[truth.sink_layers[0]]
    assert first.recall >= 0.8 and first.iou >= 0.7, first
    assert isinstance(a.summary, Attention) and a.summary.summary.layer == 11
    d = json.loads(a.summary.model_dump_json())
    assert d["summary"]["site"] == "blocks.11.attn.hook_pattern" and len(d["sink_mass"]["5"]) == 12


def test_unplanted_sinks_are_low_and_agreement_still_computed(planted):
    truth, _, res, ctrl = planted
    a, c = res["attention"], ctrl["attention"]
    assert c.summary.norm_method == "top_p"  # negative norm verdict: compared with the top 2% norms
    sinks = list(truth.sink_layers)

    def mean(values, layers):
        return sum(values[i] for i in layers) / len(layers)

    assert mean(c.summary.cls_to_patch_max, sinks) < 0.6 * mean(a.summary.cls_to_patch_max, sinks)
    assert mean(c.summary.sink_mass["5"], sinks) < mean(a.summary.sink_mass["5"], sinks) - 0.1
    assert mean(c.summary.entropy, sinks) > mean(a.summary.entropy, sinks)
    assert max(c.summary.artifact_rate) <= 0.005
    for ag in c.summary.agreement:
        assert ag.norm_method == "top_p" and ag.n_norm > 0 and ag.reason is None
        assert ag.recall is not None and 0.0 <= ag.recall <= 1.0
        assert ag.iou is not None and ag.top_p_iou is not None
    json.loads(c.summary.model_dump_json())


# models without [CLS] ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def siglip():
    torch.manual_seed(0)
    model = vitreg.load("timm:vit_base_patch16_siglip_224", pretrained=False, depth=2, img_size=64)
    return model, torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def test_no_cls_model_uses_mean_received_attention(siglip):
    model, x = siglip
    assert model.layout.n_cls == 0
    _, res, skipped = _run(model, x, [NormAnalysis(), AttentionAnalysis(max_maps=2)], 2)
    a = res["attention"]
    assert not skipped and a.summary.query == "mean_received"
    assert "mean over all queries" in a.summary.definitions["map"]
    _, cache = model.run_with_cache(x, names="blocks.*.attn.hook_pattern")
    for i in range(2):
        p = cache[f"blocks.{i}.attn.hook_pattern"]
        want = p.mean(dim=(1, 2)).view(3, 4, 4)  # heads, then queries
        assert torch.allclose(a.layer_maps[i], want[:2], atol=1e-6)
        assert a.summary.cls_to_patch_max[i] == pytest.approx(want.flatten(1).amax(1).mean().item())
    assert a.maps.shape == (2, 2, 4, 4) and a.last_layer_heads.shape == (2, 12, 4, 4)
    assert all(ag.reason is None for ag in a.summary.agreement)


def test_runs_after_norms_and_says_when_norms_are_missing(siglip):
    model, x = siglip
    _, res, _ = _run(model, x, [AttentionAnalysis(), NormAnalysis()], 3)
    a = res["attention"]
    assert a.summary.norm_method is None and any("NormAnalysis" in n for n in a.summary.notes)
    assert all(ag.reason is not None for ag in a.summary.agreement)
    assert AttentionAnalysis().not_applicable(SimpleNamespace(hook_names=lambda: ["x"]))


# hierarchical models -----------------------------------------------------------------------
def _swin_reference(p: torch.Tensor, block, grid) -> torch.Tensor:
    """Received attention per position, from timm's own window partition of position ids."""
    (h, w), ws, ss = grid, block.window_size, block.shift_size
    pos = torch.arange(h * w, dtype=torch.float32).view(1, h, w, 1)
    pos = torch.roll(pos, (-ss[0], -ss[1]), dims=(1, 2))
    pos = F.pad(pos, (0, 0, 0, -w % ws[1], 0, -h % ws[0]), value=-1.0)
    slots = window_partition(pos, ws).reshape(-1, ws[0] * ws[1]).long()  # [nW, A] position ids
    win = p.mean(1).view(-1, slots.shape[0], slots.shape[1], slots.shape[1])  # [B, nW, q, k]
    out = torch.zeros(win.shape[0], h * w)
    for n in range(slots.shape[0]):
        valid = slots[n] >= 0
        for k in valid.nonzero().flatten().tolist():
            out[:, slots[n, k]] = win[:, n, valid, k].mean(-1)
    return out.view(-1, h, w)


def test_swin_maps_undo_windows_padding_and_shift():
    torch.manual_seed(0)
    model = vitreg.load(
        "timm:swin_tiny_patch4_window7_224",
        pretrained=False,
        img_size=64,  # 16x16 stage-0 grid: padded to 21x21 for 7x7 windows
        depths=(2, 2, 2, 2),
        embed_dim=48,
    )
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    _, res, skipped = _run(model, x, [NormAnalysis(), AttentionAnalysis(max_maps=2)], 2)
    a = res["attention"]
    assert (
        not skipped
        and a.summary.query == "mean_received"
        and "window" in a.summary.definitions["map"]
    )
    assert [tuple(m.shape[-2:]) for m in a.layer_maps] == [(16, 16)] * 2 + [(8, 8)] * 2 + [
        (4, 4)
    ] * 2 + [(2, 2)] * 2
    blocks = list(model.adapter.stages()[0].blocks)
    assert blocks[1].shift_size == (3, 3)
    _, cache = model.run_with_cache(x, names="stages.0.blocks.*.attn.hook_pattern")
    for j in (0, 1):  # plain and shifted windows
        p = cache[f"stages.0.blocks.{j}.attn.hook_pattern"]
        assert torch.allclose(a.layer_maps[j], _swin_reference(p, blocks[j], (16, 16)), atol=1e-6)
    assert a.maps.shape == (2, 2, 2, 2) and a.map_layers == [6, 7]
    assert a.last_layer_heads.shape[:2] == (2, model.n_heads)
    assert all(ag.reason is None and ag.iou is not None for ag in a.summary.agreement)
    json.loads(a.summary.model_dump_json())


def test_pvt_maps_on_reduced_key_grid_and_agreement_only_on_token_grid():
    torch.manual_seed(0)
    model = vitreg.load("timm:pvt_v2_b0", pretrained=False)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    _, res, _ = _run(model, x, [NormAnalysis(), AttentionAnalysis(max_maps=2)], 2)
    a = res["attention"]
    assert a.summary.query == "mean_received" and "reduced key" in a.summary.definitions["map"]
    assert [tuple(m.shape[-2:]) for m in a.layer_maps] == [(2, 2)] * 8  # 16x16 / sr 8, ...
    _, cache = model.run_with_cache(x, names="stages.0.blocks.0.attn.hook_pattern")
    p = cache["stages.0.blocks.0.attn.hook_pattern"]
    assert torch.allclose(a.layer_maps[0], p.mean(dim=(1, 2)).view(2, 2, 2), atol=1e-6)
    for ag in a.summary.agreement[:6]:  # stages 0-2 reduce keys (sr 8, 4, 2)
        assert "reduced key grid" in ag.reason and "precision" not in ag.model_fields_set
    for ag in a.summary.agreement[6:]:  # stage 3: sr 1, keys are the tokens
        assert ag.reason is None and ag.n_norm > 0
    assert any("reduced key grid" in n for n in a.summary.notes)
    json.loads(a.summary.model_dump_json())
