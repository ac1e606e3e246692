"""docs/build_gallery.py in pieces: the page and pictures written from real runs (the golden runs
of every verb, copied where the gallery's commands write theirs), the image shrinking and budget,
the commands run as typed, and the Chromium screenshot (skipped with the reason without it)."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from PIL import Image

from conftest import ROOT, TESTS

GOLDEN = TESTS / "report" / "_golden"
#: the golden run standing in for each gallery section's run
STAND_INS = {
    "diagnose": "diagnose",
    "neurons": "neurons",
    "fix": "fix",
    "compare": "compare",
    "leaderboard": "fix_board",
    "probe": "probe",
}


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_gallery", ROOT / "docs" / "build_gallery.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gallery = load_script()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """The gallery built, without screenshots, from golden runs at the sections' run paths."""
    work = tmp_path_factory.mktemp("work")
    assert [s.key for s in gallery.SECTIONS] == list(STAND_INS)
    for section in gallery.SECTIONS:
        shutil.copytree(GOLDEN / STAND_INS[section.key], work / section.run)
    docs = tmp_path_factory.mktemp("docs")
    total = gallery.build(work, docs, None, gallery.SECTIONS)
    return work, docs, total


def test_the_page_shows_every_run_with_its_commands_and_figures(built) -> None:
    work, docs, total = built
    text = (docs / gallery.PAGE).read_text()
    for section in gallery.SECTIONS:
        assert f"## {section.title}" in text
        for argv in section.commands:
            assert f"`vitreg {' '.join(argv)}`" in text
        index = work / section.run / "figures" / "figures.json"
        for fig in json.loads(index.read_text()) if index.is_file() else []:
            assert fig["caption"] in text  # the run's own words for what the figure shows
    linked = re.findall(r"\]\(gallery/([^)]+)\)", text)
    files = sorted(p.name for p in (docs / gallery.PICTURES).iterdir())
    assert sorted(linked) == files and len(files) == len(set(files))
    assert gallery.README_PICTURE in files  # the README's picture at its fixed path
    assert "fix_fix_norm_maps.png" not in files and "fix_norm_curves.png" in files
    assert total == sum((docs / gallery.PICTURES / f).stat().st_size for f in files)
    widths = [Image.open(docs / gallery.PICTURES / f).width for f in files]
    assert max(widths) == gallery.FIGURE_WIDTH  # golden figures are wider: all downscaled


def test_the_numbers_are_read_from_each_run(built) -> None:
    work, docs, _ = built
    text = (docs / gallery.PAGE).read_text()
    fix = json.loads((work / "runs/demo_fix/metrics.json").read_text())["results"]["comparison"]
    layer = fix["detect_layer"]
    before = fix["residual"]["max_over_median_before"][layer]
    after = fix["residual"]["max_over_median_after"][layer]
    assert f"block {layer} {before:.1f} → {after:.1f}" in text
    assert f"pooled embedding cosine {fix['pooled_cosine']['mean']:.3f}" in text
    neurons = json.loads((work / "runs/demo_neurons/metrics.json").read_text())["results"]
    units = ", ".join(f"{n['layer']}:{n['unit']}" for n in neurons["neurons"])
    assert f"**{neurons['status']}** with {neurons['n_neurons']} neurons ({units}," in text
    norms = json.loads((work / "runs/demo_diagnose/metrics.json").read_text())["results"]["norms"]
    peak = max(layer["max_over_median"] for layer in norms["layers"])
    assert f"Verdict **{norms['verdict']}**" in text and f"peaks at {peak:.2f}" in text
    board = json.loads((work / "runs/clip_leaderboard/leaderboard.json").read_text())["board"]
    for row in board["rows"]:
        assert f"`{row['entry']}`: " in text
        if not row["refused"]:
            assert f"worst max/median {row['residual_max_over_median']:.2f}" in text
    probe = json.loads((work / "runs/demo_probe/metrics.json").read_text())["results"]
    for condition, layers in probe["conditions"].items():
        cls = next(s for s in layers[-1]["scores"] if s["feature"] == "cls")
        assert f"{condition}: cls {cls['mean']:.2f}" in text


def test_block_lists_read_as_words() -> None:
    assert gallery.blocks([6, 7, 8, 9, 10, 11]) == "6-11"
    assert gallery.blocks([6, 8]) == "6, 8" and gallery.blocks([6, 7]) == "6, 7"
    assert gallery.modes([]) == "no outlier mode"
    assert gallery.modes([3, 4, 5]) == "an outlier mode at blocks 3-5"


def test_shrink_downscales_onto_white_as_a_small_palette_png() -> None:
    img = Image.new("RGBA", (2400, 600), (0, 0, 0, 0))  # transparent: white once flattened
    img.paste((200, 30, 30, 255), (0, 0, 1200, 600))
    raw = io.BytesIO()
    img.save(raw, "PNG")
    small = Image.open(io.BytesIO(gallery.shrink(raw.getvalue(), 600)))
    assert small.size == (600, 150) and small.mode == "P"
    rgb = small.convert("RGB")
    assert rgb.getpixel((500, 75)) == (255, 255, 255)
    assert rgb.getpixel((100, 75)) == (200, 30, 30)
    narrow = Image.open(io.BytesIO(gallery.shrink(raw.getvalue(), 4000)))
    assert narrow.size == (2400, 600)  # never upscaled


def test_the_budget_refuses_images_over_it(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"x" * 600)
    (tmp_path / "b.png").write_bytes(b"x" * 500)
    assert gallery.check_budget(tmp_path, budget=1100) == 1100
    with pytest.raises(SystemExit, match="1,100 bytes, over 1,000"):
        gallery.check_budget(tmp_path, budget=1000)


@pytest.mark.slow  # two interpreters that import vitreg
def test_commands_run_as_typed_in_the_work_folder_and_a_failure_stops(tmp_path: Path) -> None:
    schema = gallery.Section("s", "S", (("schema", "--out", "schema.json"),), "", str)
    gallery.run_commands([schema], tmp_path)
    assert "metrics.json" in (tmp_path / "schema.json").read_text()
    with pytest.raises(SystemExit, match="`vitreg schema --out schema.json` failed"):
        gallery.run_commands([schema], tmp_path)  # an existing file is refused


def test_screenshot_draws_a_report_in_chromium(tmp_path: Path) -> None:
    browser = gallery.find_browser()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    run = shutil.copytree(GOLDEN / "diagnose", tmp_path / "run")
    shot = Image.open(io.BytesIO(gallery.screenshot(run / "report.html", browser, (800, 600))))
    assert shot.size == (800, 600)
    assert len(shot.convert("RGB").getcolors(maxcolors=1 << 20) or ()) > 50  # a drawn page


def test_reuse_needs_the_work_folder(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        gallery.main(["--reuse"])
    assert stop.value.code == 2 and "--reuse needs --work" in capsys.readouterr().err
