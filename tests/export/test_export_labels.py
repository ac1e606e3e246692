"""The labels of an export agree with diagnose's own counts on the same images: the outlier
cut and rate of each layer (the bimodal rule) and the sink events per image of its block."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import vitreg
from vitreg.configs import ExportConfig
from vitreg.export import open as open_export

SPEC, SIZE, N = "planted:clip_t16", 112, 8  # outliers from block 6, a sink event in block 7
LAYERS = (5, 7, 9)


@pytest.mark.slow  # one diagnose and one export of 8 images at 112 px
def test_flags_agree_with_diagnose(tmp_path: Path, cli_models) -> None:
    from vitreg.analysis.diagnose import diagnose
    from vitreg.analysis.norms import NormAnalysis
    from vitreg.analysis.sinks import SinkAnalysis
    from vitreg.data.images import synthetic_source

    cfg = ExportConfig(spec=SPEC, img_size=SIZE, limit=N, batch_size=4, shard_size=3,
                       layers=",".join(map(str, LAYERS)), calibration=N, out=tmp_path / "x")  # fmt: skip
    run = vitreg.run(cfg)
    model = cli_models[SPEC]
    found = diagnose(model, synthetic_source(model, n=N), analyses=[NormAnalysis(), SinkAnalysis()])
    norms, sinks = found.results.norms, found.results.sinks
    by_layer = {layer.layer: layer for layer in run.results.layers}
    flagged = 0
    for block in LAYERS:
        mine, theirs = by_layer[str(block)], norms.layers[block]
        assert mine.outlier_rate == pytest.approx(theirs.outlier_rate["auto"], abs=1e-12)
        cut = theirs.thresholds["auto"]
        # the two passes may run a block's attention by different kernels (fused, or together
        # with its statistics): equal to float rounding
        assert mine.outlier_cut == (pytest.approx(cut, rel=1e-6) if cut is not None else None)
        assert mine.sink_events_per_image == pytest.approx(sinks.blocks[block].total, abs=1e-12)
        flagged += mine.outliers
    assert flagged > 0 and by_layer["7"].sink_events_per_image > 0  # the test can fail
    tokens = open_export(run.run_dir, layer=7)
    rows = [tokens[i] for i in range(len(tokens))]
    assert sum(r["outlier"] for r in rows) == by_layer["7"].outliers
    assert sum(r["sink_heads"] for r in rows) == by_layer["7"].sink_events_per_image * N
    cut = run.index.outlier_rules["7"].cut
    assert all(r["outlier"] == (r["kind"] == 3 and r["norm"] > cut) for r in rows)  # resid_post


def test_each_image_is_forwarded_once_and_the_cut_is_fitted_on_the_first_images(
    tmp_path: Path, cli_models, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outlier rule is fitted inside the export's own pass: no image goes through the model
    twice, and the cut is diagnose's bimodal fit of the written rule-site norms of the first
    ``calibration`` images (patch tokens only)."""
    from safetensors.torch import load_file

    from vitreg.analysis.thresholds import bimodal_fit
    from vitreg.export import run as run_module

    forwarded: list[int] = []
    real = run_module.forward

    def counted(model, batch, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        forwarded.append(batch.shape[0])
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(run_module, "forward", counted)
    cfg = ExportConfig(spec=SPEC, img_size=SIZE, limit=7, batch_size=3, shard_size=2,
                       layers="5,7", calibration=4, out=tmp_path / "x")  # fmt: skip
    run = vitreg.run(cfg)
    assert sum(forwarded) == 7 and len(forwarded) == 5  # parts: 2+1, 1+2, 1
    for key in ("5", "7"):
        rule = run.index.outlier_rules[key]
        shards = [load_file(run.run_dir / s.file) for s in run.index.shards]
        norm, image, kind = (
            torch.cat([t[name] for t in shards])
            for name in (f"{key}.rule_norm", "tokens.image", "tokens.kind")
        )
        fit = bimodal_fit(norm[(image < 4) & (kind == 3)].numpy())
        assert rule.n_images == 4 and rule.bimodal == fit.present
        assert rule.cut == (float(fit.cut) if fit.present else None)
    assert any(run.index.outlier_rules[k].bimodal for k in ("5", "7"))  # the test can fail


@pytest.mark.slow  # one diagnose and one export of 6 images at 112 px
def test_lof_flags_are_diagnoses_lof_tokens(tmp_path: Path, cli_models) -> None:
    """With ``--lof`` each patch carries diagnose's LOF flag: at the penultimate block the
    exported flags are the maps of diagnose's lof analysis on the same images."""
    from vitreg.analysis.anomaly_lof import LOFAnalysis
    from vitreg.analysis.diagnose import diagnose
    from vitreg.analysis.norms import NormAnalysis
    from vitreg.data.images import synthetic_source

    block = 8  # the penultimate of its 10 blocks
    cfg = ExportConfig(spec=SPEC, img_size=SIZE, limit=6, batch_size=4, shard_size=4,
                       layers=f"{block},{block + 1}", lof=True, out=tmp_path / "x")  # fmt: skip
    run = vitreg.run(cfg)
    model = cli_models[SPEC]
    assert model.n_layers == 10
    found = diagnose(model, synthetic_source(model, n=6), analyses=[NormAnalysis(), LOFAnalysis()])
    maps = torch.tensor(found.results.lof.maps)  # [images, h, w]: 1 flagged, 0 not
    tokens = open_export(run.run_dir, layer=block)
    got = torch.full_like(maps, -1)
    for r in (tokens[i] for i in range(len(tokens))):
        if r["kind"] == 3:
            got[r["image"], r["row"], r["col"]] = int(r["lof"])
        else:
            assert not r["lof"] and math.isnan(r["lof_score"])
    assert torch.equal(got, maps) and maps.sum() > 0
    by_layer = {layer.layer: layer for layer in run.results.layers}
    assert by_layer[str(block)].lof_tokens == int(maps.sum())
    assert by_layer[str(block + 1)].lof_tokens is not None
    again = vitreg.run(cfg.model_copy(update={"lof": False, "out": tmp_path / "plain"}))
    assert all(layer.lof_tokens is None for layer in again.results.layers)
    assert "lof" not in open_export(again.run_dir, layer=block)[0]
