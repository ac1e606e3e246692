"""The labels of an export agree with diagnose's own counts on the same images: the outlier
cut and rate of each layer (the bimodal rule) and the sink events per image of its block."""

from __future__ import annotations

from pathlib import Path

import pytest

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
