"""File names that are Markdown or HTML (a backtick, ``|``, a tag, ``*``) are written into
report.md and report.html as names: tables keep their columns, nothing is rendered as markup."""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from PIL import Image
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.report.render.html import inline
from vitreg.report.render.markdown import Table, code, code_span, escape_text, markdown_table

NAMES = ["a`b.png", "`lead.png", "pipe|name.png", "<b>bold</b>.png", "*star*.png", "``.png"]
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("one_thread")


def table_cells(markdown: str) -> list[list[str]]:
    """The body cells of the GFM tables in ``markdown``, as the text a reader sees."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    rows, row = [], None
    for tok in tokens:
        if tok.type == "tr_open":
            row = []
        elif tok.type == "inline" and row is not None:
            row.append("".join(c.content for c in tok.children or []))
        elif tok.type == "tr_close":
            rows.append(row)
            row = None
    return rows


def test_code_span_keeps_every_name_one_cell_of_literal_text() -> None:
    rows = [[code_span(n), escape_text(f"cannot read '{n}'")] for n in NAMES]
    body = table_cells(markdown_table(Table(["file", "reason"], rows)))[1:]
    assert [r[0] for r in body] == NAMES and all(len(r) == 2 for r in body)
    assert [r[1] for r in body] == [f"cannot read '{n}'" for n in NAMES]
    for name in NAMES:
        assert code(name) == code_span(name)  # every inline-code writer fences the same way
        html = inline(code_span(name))
        assert html.startswith("<code>") and html.count("<code>") == 1
        assert "<b>" not in html and "<em>" not in html


def test_diagnose_report_lists_hostile_file_names_intact(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (32, 32), (40 * i, 90, 200)).save(folder / f"good{i}.png")
    bad = ["a`b|<b>x.png", "*c*.jpg", "<img src=x onerror=alert(1)>.png"]
    for name in bad:
        (folder / name).write_bytes(b"not an image")
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["diagnose", "timm:vit_tiny_patch16_224", "--random-init", "--img-size", "32",
         "--images", str(folder), "--out", str(out), "--max-maps", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    rows = {Path(row[0]).name: row for row in table_cells(report) if row}
    for name in bad:  # one row of two cells: the path, and the reason that quotes it
        assert name in rows and len(rows[name]) == 2, rows
        assert name in rows[name][1] and "decoded" in rows[name][1]
    html = (out / "report.html").read_text()
    assert "<b>x" not in html and "&lt;b&gt;x" in html and "<img src=x" not in html


def test_neurons_console_split_is_the_one_in_metrics_json(tmp_path: Path) -> None:
    """A file listed as an image but not decodable shifts the split: the console reports the
    images used, as metrics.json does, not the count planned from the listing."""
    import json

    from vitreg.testing.images import synthetic_pil

    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "00-broken.png").write_bytes(b"not a png")
    for i, img in enumerate(synthetic_pil(8, 112, seed=0, flat_fraction=0.1)):
        img.save(folder / f"{i + 1:02d}.png")
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["neurons", "planted:dinov2_s14", "--images", str(folder), "--img-size", "112",
         "--top-k", "3", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    split = json.loads((out / "metrics.json").read_text())["data"]["split"]
    assert (split["n_discovery"], split["n_held_out"]) == (6, 2)
    console = " ".join(result.stdout.split())
    assert "split: 6 images for discovery, 2 held out" in console


HOSTILE_TEXT = "<script>alert(1)</script><img src=x onerror=alert(2)> [go](javascript:alert(3)) `x"


@pytest.mark.parametrize("verb", ["diagnose", "fix", "neurons", "train", "probe"])
def test_report_md_escapes_the_user_supplied_strings(tmp_path: Path, verb: str) -> None:
    import json
    import shutil

    golden = Path(__file__).parents[1] / "report" / "_golden" / verb
    run = tmp_path / verb
    shutil.copytree(golden, run)
    doc = json.loads((run / "metrics.json").read_text())
    doc["model"]["spec"] = f"planted:{HOSTILE_TEXT}"
    doc["model"]["notes"] = [HOSTILE_TEXT]
    doc["data"]["description"] = HOSTILE_TEXT
    doc["config"]["spec"] = doc["model"]["spec"]
    (run / "metrics.json").write_text(json.dumps(doc))
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    md = (run / "report.md").read_text()
    html = MarkdownIt("commonmark", {"html": True}).render(md)  # as a permissive viewer shows it
    for raw in ("<script", "<img src=x", 'href="javascript'):  # figures are <img src="figures/
        assert raw not in html, (raw, verb)
    assert "&lt;script&gt;" in md
    page = (run / "report.html").read_text()
    assert "<script>alert" not in page and "<img src=x" not in page
