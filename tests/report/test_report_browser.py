"""report.html in headless Chromium: no console errors, and the layer slider changes the maps.

Needs the Debian ``chromium`` and ``chromium-driver`` packages (.ci/run installs them). Without
them the test skips locally; under CI (``CI=true``) a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import vitreg
from _support.saved_config import SavedConfig
from vitreg.analysis.diagnose import diagnose
from vitreg.report.renderers.diagnose import write_diagnose_run
from vitreg.testing.images import synthetic_images

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
)


def write_run(out: Path, result: Any, **kwargs: Any) -> Path:
    """The run directory ``out`` of a diagnose result, written by the report layer's writer."""
    write_diagnose_run(out, result, **kwargs)
    return out


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report of a small random-weight ViT with registers, every analysis, 4 images."""
    torch.manual_seed(0)
    model = vitreg.load(
        "timm:vit_small_patch14_reg4_dinov2", pretrained=False, img_size=56, depth=3
    )
    x = synthetic_images(4, 56, seed=0)
    result = diagnose(model, x, max_maps=4)
    out = tmp_path_factory.mktemp("browser") / "run"
    return write_run(out, result, images=x, config=SavedConfig(), command="test") / "report.html"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if BROWSER is None or DRIVER is None:
        missing = "chromium" if BROWSER is None else "chromedriver"
        reason = f"{missing} is not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; .ci/run must install it")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = BROWSER
    for flag in (*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    yield drv
    drv.quit()


def test_slider_changes_the_maps_without_console_errors(report_html: Path, driver: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(report_html.as_uri())
    WebDriverWait(driver, 10).until(
        lambda d: d.execute_script("return document.body.dataset.ready")
    )

    def state() -> dict:
        return driver.execute_script(
            "return {label: document.getElementById('layer-label').textContent,"
            " value: document.getElementById('layer-slider').value,"
            " norm: document.getElementById('norm-0').toDataURL(),"
            " attn: document.getElementById('attn-0').toDataURL(),"
            " blank: document.createElement('canvas').toDataURL()}"
        )

    before = state()
    assert before["label"].startswith(
        "block 2 (blocks.2.hook_resid_post"
    )  # last block (no artifacts)
    slider = driver.find_element(By.ID, "layer-slider")
    slider.send_keys(Keys.ARROW_LEFT)
    after = state()
    assert after["value"] == "1" and after["label"].startswith("block 1 (blocks.1.hook_resid_post")
    assert after["norm"] != before["norm"] and after["attn"] != before["attn"]
    slider.send_keys(Keys.END)  # the last position: after the final norm, no attention map
    final = state()
    assert final["label"].startswith("after final norm (ln_final.hook_out")
    assert final["norm"] != after["norm"]
    assert "no attention map at this position" in driver.find_element(By.ID, "scale-label").text
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    sources = driver.execute_script(
        "return Array.from(document.querySelectorAll('[src],[href]'))"
        ".map(e => e.getAttribute('src') || e.getAttribute('href'))"
    )
    assert sources and all(s.startswith(("data:", "#")) for s in sources)  # nothing external


@pytest.fixture(scope="module")
def report_kinds(report_html: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """report.html of every kind, each built once with the smallest settings (planted models,
    few images, small batches; a random-init tiny ViT for the probe)."""
    from typer.testing import CliRunner

    from vitreg.cli.app import app

    root = tmp_path_factory.mktemp("kinds")
    planted = ["--img-size", "112", "--batch-size", "4"]
    commands = {
        "diagnose --models": [
            "diagnose",
            "--models",
            "planted:dinov2_s14,planted:deit3_s16",
            "--img-size",
            "112",
            "--limit",
            "2",
            "--max-maps",
            "2",
        ],
        "neurons": ["neurons", "planted:dinov2_s14", *planted, "--limit", "8"],
        "fix": [
            "fix",
            "planted:dinov2_s14",
            "--neurons",
            str(root / "neurons" / "neurons.json"),
            *planted,
            "--limit",
            "4",
        ],
        "probe": [
            "probe",
            "timm:vit_tiny_patch16_224",
            "--random-init",
            "--img-size",
            "32",
            "--epochs",
            "2",
            "--seeds",
            "2",
            "--batch-size",
            "8",
            "--data",
            "synthetic-cls:n=16,size=32",
            "--cache",
            str(root / "cache"),
        ],
    }
    runner = CliRunner()
    paths = {"diagnose": report_html}
    for kind, args in commands.items():
        out = root / kind.split()[0] if kind != "diagnose --models" else root / "models"
        result = runner.invoke(app, [*args, "--out", str(out)])
        assert result.exit_code == 0, (kind, result.output)
        paths[kind] = out / "report.html"
    (root / "not-a-run").mkdir()
    runs = [root / "models" / "planted-dinov2_s14", root / "fix", root / "not-a-run"]
    compare = [*map(str, runs), "--out", str(root / "compare")]
    result = runner.invoke(app, ["compare", *compare])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "not-a-run" in result.output
    paths["compare"] = root / "compare" / "report.html"
    return paths


PAGE_CHECK = """
const page = document.documentElement.clientWidth;
const wide = Array.from(document.querySelectorAll('body *'))
  .filter(e => e.getBoundingClientRect().right > page + 1)
  .map(e => e.tagName + ' ' + (e.id || e.className || e.textContent.slice(0, 40)));
const broken = Array.from(document.images)
  .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt.slice(0, 60));
return {text: document.body.innerText, wide: wide, broken: broken, images: document.images.length};
"""


@pytest.mark.parametrize(
    "kind", ["diagnose", "diagnose --models", "neurons", "fix", "probe", "compare"]
)
def test_every_report_kind_renders_clean(
    kind: str, report_kinds: dict[str, Path], driver: Any
) -> None:
    """No console error, no raw Markdown or Python repr in the visible text, nothing wider than
    the page, every image loads."""
    import re

    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_window_size(1024, 900)
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(report_kinds[kind].as_uri())
    WebDriverWait(driver, 10).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    page = driver.execute_script(PAGE_CHECK)
    text = page["text"]
    for marker in ("`", "**", "{'", "['", "*fixed*"):
        assert marker not in text, (kind, marker, text[text.find(marker) - 80 :][:160])
    assert not re.search(r"\bNone\b", text), (kind, re.findall(r".{40}\bNone\b.{20}", text))
    assert page["wide"] == [], (kind, page["wide"][:5])
    assert page["broken"] == [], (kind, page["broken"])
    if kind != "probe":
        assert page["images"] > 0, kind
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], (kind, errors)
