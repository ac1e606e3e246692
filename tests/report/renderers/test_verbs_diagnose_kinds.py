"""The issue-20 report sections: the per-kind verdict first, then sinks, massive activations,
LOF, position-tied and register sections, on a plant and on the real architectures offline."""

from __future__ import annotations

import warnings

import pytest
import torch

import vitreg
from vitreg.analysis.anomaly_lof import LOFAnalysis
from vitreg.analysis.diagnose import diagnose
from vitreg.analysis.massive import MassiveAnalysis
from vitreg.analysis.norms import NormAnalysis
from vitreg.analysis.positions import PositionAnalysis
from vitreg.analysis.registers import RegisterAnalysis
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.report.render.markdown import Report, Table, render_markdown
from vitreg.report.renderers.diagnose_figures import kinds_figures
from vitreg.report.renderers.diagnose_kinds import detail_sections, kinds_section
from vitreg.results.diagnose import DiagnoseResults


def _run(model: vitreg.Model, size: int) -> DiagnoseResults:
    """The typed results of the per-kind analyses, as metrics.json holds them."""
    x = torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(0))
    chosen = [NormAnalysis(), SinkAnalysis(), MassiveAnalysis(), LOFAnalysis()]
    chosen += [PositionAnalysis(), RegisterAnalysis()]
    return diagnose(model, x, analyses=chosen).results


def _markdown(r: DiagnoseResults) -> str:
    return render_markdown(Report(None, "t", [kinds_section(r), *detail_sections(r)]))


def test_plant_sections_name_the_broadcast_head() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitreg.load("planted:kinds_broadcast_sink")
    r = _run(model, 64)
    first = kinds_section(r)
    assert first.key == "kinds" and "broadcast sinks" in first.blocks[0]
    table = next(b for b in first.blocks if isinstance(b, Table))
    assert [r[1] for r in table.rows].count("**yes**") == 1
    sinks = detail_sections(r)[0]
    heads = next(b for b in sinks.blocks if isinstance(b, Table))
    assert heads.rows[0][:4] == ["3", "2", "broadcast", "cls"]
    figs = {f.name: f for f in kinds_figures(r)}
    assert set(figs) == {"sink_map", "sink_concentration", "position_maps"}
    assert figs["sink_map"].png and figs["sink_concentration"].png


ARCHS = {  # timm architectures, random weights, tiny depth and images
    "dinov2_reg4": ("vit_small_patch14_reg4_dinov2", dict(img_size=56, depth=2), 56),
    "siglip": (
        "vit_base_patch16_siglip_224",
        dict(img_size=32, depth=2, embed_dim=64, num_heads=2),
        32,
    ),
    "dinov3": ("vit_small_patch16_dinov3", dict(img_size=64, depth=2), 64),
}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_real_architectures_show_register_and_position_sections(arch: str) -> None:
    name, kwargs, size = ARCHS[arch]
    model = vitreg.load(f"timm:{name}", pretrained=False, **kwargs)
    text = _markdown(_run(model, size))
    assert "## Register tokens" in text and "## Position-tied artifacts" in text
    if model.layout.n_reg:
        assert "4 registers, 0 inserted" in text and "register norm" in text
    else:
        assert "The model has no register tokens." in text
    if arch == "dinov3":  # RoPE: no learned position embedding to measure
        assert "RoPE" in text
    else:
        assert "Position embedding: max/median norm" in text
    assert "Sink events per image" in text  # W_O and LayerScale found on every family
