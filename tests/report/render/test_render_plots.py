"""Paper-ready figures: 200 dpi PNGs, plain tick labels (no offset text), vector copies on request."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.report.render.plots import DPI, Figure, all_axes, figure_formats
from vitreg.report.renderers.fix import before_after_maps


def offset_texts(fig: Figure) -> list[str]:
    """Every axis' offset text (``+1.9595e1`` and the like) once the figure is drawn."""
    src = fig.source
    src.canvas.draw()
    return [a.get_offset_text().get_text() for ax in all_axes(src) for a in (ax.xaxis, ax.yaxis)]


def test_maps_near_a_large_constant_have_plain_ticks_at_200_dpi() -> None:
    """Norms after the final norm sit near one value: the colour bar once read ``+1.9595e1``."""
    rng = np.random.default_rng(0)
    before = 19.5955 + 1e-4 * rng.random((2, 4, 4))
    after = 19.5955 + 1e-4 * rng.random((2, 4, 4))
    fig = before_after_maps("maps", before, after, None, "{n} images")
    assert [t for t in offset_texts(fig) if t] == []
    labels = [t.get_text() for ax in all_axes(fig.source) for t in ax.get_xticklabels()]
    assert any(lab.startswith("19.59") for lab in labels), labels  # the colour bars' ticks
    png = Image.open(io.BytesIO(fig.png))
    assert png.info["dpi"][0] == pytest.approx(DPI, abs=0.01)
    assert DPI == 200


def test_vector_copies_next_to_the_png(tmp_path: Path) -> None:
    fig = before_after_maps("maps", np.ones((1, 2, 2)), np.zeros((1, 2, 2)), None, "{n}")
    paths = fig.save(tmp_path, figure_formats("pdf"))
    assert [p.name for p in paths] == ["maps.png", "maps.pdf"]
    assert (tmp_path / "maps.pdf").read_bytes().startswith(b"%PDF")
    assert figure_formats(None) == ()
    with pytest.raises(ValueError, match="svg, pdf"):
        figure_formats("eps")


def test_figure_format_svg_writes_svgs_next_to_pngs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["diagnose", "--img-size", "56", "--limit", "2", "--max-maps", "2"]
    result = CliRunner().invoke(app, [*args, "--figure-format", "svg", "--out", str(out)])
    assert result.exit_code == 0, result.output
    pngs = sorted(p.stem for p in (out / "figures").glob("*.png"))
    svgs = sorted(p.stem for p in (out / "figures").glob("*.svg"))
    assert pngs and svgs == pngs
    assert (out / "figures" / f"{svgs[0]}.svg").read_text().lstrip().startswith("<?xml")
    assert "figure_format: svg" in (out / "config.yaml").read_text()
    bad = CliRunner().invoke(app, [*args, "--figure-format", "png", "--out", str(out)])
    assert bad.exit_code == 2 and "figure-format" in bad.output


def test_log_axes_read_plain_numbers() -> None:
    """A log axis spanning less than a decade labelled 2, 3, 4, not 2 x 10^0."""
    from vitreg.report.compare import layer_curves
    from vitreg.results.schema import RunDocument

    doc = json.loads((Path(__file__).parents[1] / "schema_1_1_diagnose.json").read_text())
    first = doc["results"]["norms"]["layers"][0]
    doc["results"]["norms"]["layers"] = [
        {**first, "layer": i, "outlier_rate": {"auto": 0.0}, "max_over_median": 2 + i}
        for i in range(3)
    ]
    fig = layer_curves([("m", RunDocument.model_validate(doc))])
    fig.source.canvas.draw()
    ratio = fig.source.axes[1]
    labels = [t.get_text() for t in ratio.get_yticklabels(which="both") if t.get_text()]
    assert labels and all(re.fullmatch(r"[0-9.]+", lab) for lab in labels), labels


def test_a_line_of_nearly_equal_values_gets_short_tick_labels() -> None:
    """The experiment's mIoU axis of issue 19 (0.199702 to 0.199714): widened to 2% of the
    values, its labels are plain and short, never offset notation."""
    from vitreg.report.render.plots import encode, new_canvas

    fig = new_canvas(4, 3)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1, 2], [0.199702, 0.199714, 0.199709])
    encode(fig, "png")
    lo, hi = ax.get_ylim()
    assert hi - lo >= 0.02 * 0.1997 and lo < 0.199702 and hi > 0.199714
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(len(t) <= 6 for t in labels), labels
    assert ax.yaxis.get_offset_text().get_text() == ""


def test_a_scatter_of_nearly_equal_values_is_widened_too() -> None:
    """Points drawn with ``scatter`` (no line) near one value get the same plain, short axis."""
    from vitreg.report.render.plots import encode, new_canvas

    fig = new_canvas(4, 3)
    ax = fig.add_subplot(1, 1, 1)
    ax.scatter([0.0, 1.5, 3.0], [0.199702, 0.199714, 0.199709])
    encode(fig, "png")
    lo, hi = ax.get_ylim()
    assert hi - lo >= 0.02 * 0.1997
    assert ax.yaxis.get_offset_text().get_text() == ""
    assert all(len(t.get_text()) <= 6 for t in ax.get_yticklabels())


def test_a_one_block_line_is_drawn_as_a_point_with_a_plain_axis() -> None:
    """A per-block curve of a one-block model (one x position) still shows its value."""
    from vitreg.report.render.plots import encode, new_canvas

    fig = new_canvas(4, 3)
    ax = fig.add_subplot(1, 1, 1)
    (line,) = ax.plot([0], [19.6], ls="--")
    ax.set_xlabel("block")
    encode(fig, "png")
    assert line.get_marker() == "o"
    assert [a.get_offset_text().get_text() for a in (ax.xaxis, ax.yaxis)] == ["", ""]


def test_report_html_shows_figures_at_column_width_and_figures_keeps_them_whole() -> None:
    import base64
    import io

    import numpy as np
    from PIL import Image

    from vitreg.report.render.images import DISPLAY_WIDTH, display_uri
    from vitreg.report.render.plots import figure, new_canvas

    fig = new_canvas(12, 4)
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(np.random.default_rng(0).random((16, 48)), cmap="inferno")
    full = figure("maps", "caption", fig).png
    uri = display_uri(full)
    head, data = uri.split(",", 1)
    shown = base64.b64decode(data)
    assert head == "data:image/webp;base64" and display_uri(full) == uri  # deterministic
    width = {
        name: Image.open(io.BytesIO(b)).width for name, b in (("full", full), ("shown", shown))
    }
    assert width["shown"] == DISPLAY_WIDTH < width["full"] and len(shown) < len(full)
