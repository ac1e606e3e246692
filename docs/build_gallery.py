"""Build the gallery, docs/gallery.md and docs/gallery/*.png, from fresh runs of the offline demo.

    python docs/build_gallery.py [--work DIR [--reuse]]

Runs each command of :data:`SECTIONS` as written, in a work folder (the planted demo: synthetic
models and images, nothing downloaded), takes a headless-Chromium screenshot of each run's
report.html, copies each run's figures downscaled, and writes docs/gallery.md: every picture with
its caption, the figures read from the run's results, and the commands that made it. Needs
vitreg, Pillow and Chromium (``chromium`` or ``chromium-browser`` on PATH). About 8 minutes of
CPU time, most of it the leaderboard.
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

DOCS = Path(__file__).resolve().parent
PAGE = "gallery.md"
PICTURES = "gallery"  # docs/gallery/: the images the page shows
README_PICTURE = "demo_fix.png"  # the README's picture: the demo's norm maps before/after the fix
BUDGET = 4_000_000  # bytes: every image of the gallery together
FIGURE_WIDTH = 1000  # px: figures are downscaled to at most this width
SHOT_WINDOW = (1280, 1600)  # px: the browser window a report is drawn in
SHOT_WIDTH = 900  # px: screenshots are downscaled to this width
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",  # the report's scripts (the block slider) run before the shot
)
Argv = tuple[str, ...]  # a vitreg command's arguments, after "vitreg"
Results = TypeVar("Results", bound=BaseModel)


@dataclass(frozen=True)
class Section:
    """One run of the gallery: the commands that make it (the last one writes the run shown,
    into its ``--out``), what it shows, and the sentence of figures read from its results."""

    key: str  # the prefix of its pictures in docs/gallery/
    title: str
    commands: tuple[Argv, ...]
    intro: str
    numbers: Callable[[Path], str]
    rename: tuple[tuple[str, str], ...] = ()  # (figure name, picture file) kept at a fixed path

    @property
    def run(self) -> str:
        """The run folder the section shows, relative to the work folder."""
        last = self.commands[-1]
        return last[last.index("--out") + 1]


@dataclass(frozen=True)
class Picture:
    """One image of the page: its file in docs/gallery/, a title and its caption."""

    file: str
    title: str
    caption: str


# -- the figures each run holds, read from its typed results -------------------------------------


def results(run: Path, model: type[Results]) -> Results:
    """The results of a run folder's metrics.json as ``model``, its verb's results model."""
    from vitreg.report.documents import read_metrics

    return model.model_validate(read_metrics(run).results)


def blocks(found: Sequence[int]) -> str:
    """Block numbers as a reader says them: "6-11", "6, 8", or "none"."""
    if not found:
        return "none"
    if list(found) == list(range(found[0], found[-1] + 1)) and len(found) > 2:
        return f"{found[0]}-{found[-1]}"
    return ", ".join(str(b) for b in found)


def modes(found: Sequence[int]) -> str:
    """Where a run's patch norms show an outlier mode, in words."""
    return f"an outlier mode at blocks {blocks(found)}" if found else "no outlier mode"


def diagnose_numbers(run: Path) -> str:
    """The verdict, where the outliers are and how far they stand out."""
    from vitreg.results.diagnose import DiagnoseResults

    norms = results(run, DiagnoseResults).norms
    ratios = [layer.max_over_median for layer in norms.layers]
    peak = max(range(len(ratios)), key=lambda i: ratios[i])
    ev = norms.evidence
    if not norms.artifacts_present:
        return (
            f"Verdict **{norms.verdict}**: no block's patch norms split into an outlier mode; "
            f"max/median patch norm peaks at {ratios[peak]:.2f} (block {peak})."
        )
    return (
        f"Verdict **{norms.verdict}**: an outlier mode from block {norms.emergence_layer} on "
        f"(blocks {blocks(ev.layers_with_outlier_mode)}); at block {ev.strongest_layer} "
        f"{ev.outlier_rate:.1%} of patch tokens are outliers, their median norm "
        f"{ev.mode_ratio:.1f}x the bulk's; max/median patch norm peaks at {ratios[peak]:.1f} "
        f"(block {peak}) against {ratios[0]:.2f} at block 0, over {norms.n_images} images."
    )


def neurons_numbers(run: Path) -> str:
    """The units chosen, against the planted truth, and what their fix leaves held out."""
    from vitreg.results.neurons import NeuronsResults

    found = results(run, NeuronsResults)
    held = found.held_out
    units = ", ".join(f"{n.layer}:{n.unit}" for n in found.neurons)
    text = (
        f"**{found.status}** with {found.n_neurons} neurons ({units}, block:unit) chosen by the "
        f"causal check; on {held.n_images} held-out images max/median patch norm at block "
        f"{found.detect_layer} goes from {held.max_over_median_before:.1f} to "
        f"{held.max_over_median_after:.2f} (ordinary patches: "
        f"{held.ordinary_max_over_median:.2f}), "
        f"blocks with an outlier mode {blocks(held.blocks_with_outlier_mode_before)} → "
        f"{blocks(held.blocks_with_outlier_mode_after)}."
    )
    planted = found.planted or []
    causes = [p for p in planted if p.role.startswith("cause")]
    others = [p for p in planted if not p.role.startswith("cause")]
    if causes:
        text += (
            f" Of the planted units, {sum(p.chosen for p in causes)} of the {len(causes)} that "
            f"write the outliers are chosen, and {sum(p.chosen for p in others)} of the "
            f"{len(others)} readers and helpers."
        )
    return text


def fix_numbers(run: Path) -> str:
    """Blocks with an outlier mode and max/median before and after, and what the fix keeps."""
    from vitreg.results.fix import FixResults

    comp = results(run, FixResults).comparison
    res, layer = comp.residual, comp.detect_layer
    return (
        f"**{res.verdict}**: blocks with an outlier mode {blocks(res.blocks_with_mode_before)} → "
        f"{blocks(res.blocks_with_mode_after)}; max/median patch norm at block {layer} "
        f"{res.max_over_median_before[layer]:.1f} → {res.max_over_median_after[layer]:.1f} "
        f"(ordinary patches: {res.ordinary_max_over_median:.1f}); outlier rate "
        f"{comp.outlier_rate_before:.2%} → {comp.outlier_rate_after:.2%}; pooled embedding cosine "
        f"{comp.pooled_cosine.mean:.3f}, patch feature cosine {comp.patch_cosine.mean:.3f} "
        "(mean, before against after)."
    )


def compare_numbers(run: Path) -> str:
    """How many runs and metrics, and each diagnose run's emergence block and peak max/median."""
    from vitreg.report.documents import read_comparison

    comp = read_comparison(run)
    diagnose = {
        r.metric.removesuffix(" (diagnose)"): r.values for r in comp.rows if r.verb == "diagnose"
    }
    empty = [None] * len(comp.runs)
    emerge = diagnose.get("emergence_layer", empty)
    peak = diagnose.get("norm_ratio.max_over_median.peak", empty)
    parts = [
        f"`{name}` "
        + (f"has outliers from block {e}" if e is not None else "has no outlier mode")
        + f", peak max/median {p:.1f}"
        for name, e, p in zip(comp.runs, emerge, peak, strict=True)
        if p is not None
    ]
    head = f"{len(comp.runs)} runs side by side on {len(comp.rows)} metrics"
    return head + (": " + "; ".join(parts) if parts else "") + "."


def leaderboard_numbers(run: Path) -> str:
    """Each entry's blocks with an outlier mode and worst max/median."""
    from vitreg.report.documents import read_leaderboard

    board = read_leaderboard(run).board
    parts = [
        f"`{row.entry}`: refused ({row.refused})"
        if row.refused
        else f"`{row.entry}`: {modes(row.blocks_with_mode)}, worst max/median "
        f"{row.residual_max_over_median:.2f}"
        for row in board.rows
    ]
    return f"On {board.n_images} images, after each fix: " + "; ".join(parts) + "."


def probe_numbers(run: Path) -> str:
    """Each condition's top-1 of [CLS] and the mean patch, over seeds with the 95% half-width."""
    from vitreg.results.probe import ProbeResults

    found = results(run, ProbeResults)
    seeds = f"{len(found.seeds)} probe seed" + ("s" if len(found.seeds) != 1 else "")
    parts = []
    for condition, layers in found.conditions.items():
        scores = [
            f"{score.feature} {score.mean:.2f}"
            + (f" ± {score.ci95:.2f}" if score.ci95 is not None else "")
            for score in layers[-1].scores
            if (score.feature, score.group, score.metric) in PROBED and score.mean is not None
        ]
        parts.append(f"{condition}: " + ", ".join(scores))
    return (
        f"{found.task.capitalize()} top-1 over {seeds} at `{found.layers[-1]}`: "
        + "; ".join(parts)
        + "."
    )


#: the scores the probe's sentence gives: (feature, token group, metric)
PROBED = (("cls", "all", "top1"), ("patch_mean", "all", "top1"))
LEADERBOARD = "ttr,naclip,sclip,clearclip,sc-clip,ttr+naclip"
SECTIONS = (
    Section(
        "diagnose",
        "Diagnose: the demo's artifacts",
        (("diagnose", "--out", "runs/demo_diagnose"),),
        "`vitreg diagnose` with no model runs the embedded demo: a synthetic ViT-S/14 "
        "(`planted:dinov2_s14`, random weights with planted register neurons) on 16 synthetic "
        "images. The report opens with the artifact kinds and the block slider over the norm "
        "and attention maps.",
        diagnose_numbers,
    ),
    Section(
        "neurons",
        "Neurons: the units that write the outliers",
        (("neurons", "--out", "runs/demo_neurons"),),
        "`vitreg neurons` finds the register neurons with nothing set by hand and checks their "
        "fix on held-out images.",
        neurons_numbers,
    ),
    Section(
        "fix",
        "Fix: test-time registers, before and after",
        (("fix", "--neurons", "runs/demo_neurons/neurons.json", "--out", "runs/demo_fix"),),
        "`vitreg fix` with the neurons just found compares the model without and with "
        "test-time registers on the same images.",
        fix_numbers,
        rename=(("fix_norm_maps", README_PICTURE),),
    ),
    Section(
        "compare",
        "Compare: two planted models",
        (
            ("diagnose", "planted:deit3_s16", "--out", "runs/deit3_diagnose"),
            ("compare", "runs/demo_diagnose", "runs/deit3_diagnose", "--out", "runs/demo_compare"),
        ),
        "`vitreg compare` merges the headline metrics of runs into one table and draws "
        "per-block curves, here the demo against a planted DeiT-III-S/16.",
        compare_numbers,
    ),
    Section(
        "leaderboard",
        "Leaderboard: every training-free fix on the planted CLIP",
        (
            (
                *("fix", "planted:clip_b16", "--method", LEADERBOARD),
                *("--img-size", "112", "--limit", "16", "--out", "runs/clip_leaderboard"),
            ),
        ),
        "`vitreg fix --method A,B,...` scores every fix against the unfixed model on the same "
        "images. Last-block methods rewrite the final block only, so the outliers of the blocks "
        "before it stay; throughput columns depend on the machine.",
        leaderboard_numbers,
    ),
    Section(
        "probe",
        "Probe: what the tokens know, without and with the fix",
        (
            (
                *("probe", "--img-size", "112", "--task", "classification"),
                *("--data", "synthetic-cls:n=200,hue=1", "--fix", "both"),
                *("--out", "runs/demo_probe"),
            ),
        ),
        "`vitreg probe --fix both` trains linear probes on the frozen tokens of the demo model "
        "without (`base`) and with test-time registers, on shapes painted in their class's hue.",
        probe_numbers,
    ),
)


# -- running the commands ------------------------------------------------------------------------


def command(argv: Argv) -> str:
    """The command line a user types."""
    return shlex.join(("vitreg", *argv))


def run_commands(sections: Sequence[Section], work: Path) -> None:
    """Run every section's commands in ``work``, in order, as a user would type them."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VITREG_PROGRESS": "off"}
    for section in sections:
        for argv in section.commands:
            print(f"$ {command(argv)}", flush=True)
            code = "import sys; from vitreg.cli.app import main; sys.argv[0] = 'vitreg'; main()"
            done = subprocess.run([sys.executable, "-c", code, *argv], cwd=work, env=env)
            if done.returncode != 0:
                raise SystemExit(f"`{command(argv)}` failed (exit code {done.returncode})")


# -- pictures ------------------------------------------------------------------------------------


def find_browser() -> str | None:
    """Chromium's path, or None when neither ``chromium`` nor ``chromium-browser`` is on PATH."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html: Path, browser: str, window: tuple[int, int] = SHOT_WINDOW) -> bytes:
    """PNG bytes of ``html`` as headless Chromium draws the top of it in a ``window`` (w, h)."""
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "shot.png"
        cmd = [
            browser,
            *BROWSER_FLAGS,
            f"--user-data-dir={Path(tmp) / 'profile'}",
            f"--window-size={window[0]},{window[1]}",
            f"--screenshot={png}",
            html.resolve().as_uri(),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if not png.is_file():
            raise RuntimeError(f"{browser} drew no screenshot of {html}: {done.stderr[-800:]}")
        return png.read_bytes()


def shrink(png: bytes, width: int) -> bytes:
    """The image downscaled to at most ``width`` px wide, on white, as a 256-colour PNG."""
    from PIL import Image

    img = Image.open(io.BytesIO(png))
    flat = Image.new("RGB", img.size, "white")
    flat.paste(img, mask=img.convert("RGBA").getchannel("A"))
    if flat.width > width:
        flat = flat.resize(
            (width, round(flat.height * width / flat.width)), Image.Resampling.LANCZOS
        )
    out = io.BytesIO()
    flat.quantize(colors=256, method=Image.Quantize.MAXCOVERAGE).save(out, "PNG", optimize=True)
    return out.getvalue()


def section_pictures(
    section: Section, run: Path, pictures: Path, browser: str | None
) -> list[Picture]:
    """Write the section's screenshot (when a browser is given) and figures into ``pictures``."""
    from vitreg.report.writer import saved_figures

    found = []
    if browser is not None:
        file = f"{section.key}_report.png"
        (pictures / file).write_bytes(shrink(screenshot(run / "report.html", browser), SHOT_WIDTH))
        width, height = SHOT_WINDOW
        caption = (
            f"The top of the run's report.html, drawn by headless Chromium at {width} x {height} "
            "px."
        )
        found.append(Picture(file, "report.html", caption))
    renamed = dict(section.rename)
    for fig in saved_figures(run):
        name = fig.name if fig.name.startswith(f"{section.key}_") else f"{section.key}_{fig.name}"
        file = renamed.get(fig.name, f"{name}.png")
        (pictures / file).write_bytes(shrink(fig.png, FIGURE_WIDTH))
        found.append(Picture(file, f"figures/{fig.name}.png", fig.caption))
    return found


def check_budget(pictures: Path, budget: int = BUDGET) -> int:
    """The bytes of every PNG in ``pictures``; SystemExit when they exceed ``budget``."""
    total = sum(p.stat().st_size for p in pictures.glob("*.png"))
    if total > budget:
        raise SystemExit(f"the gallery's images take {total:,} bytes, over {budget:,}")
    return total


# -- the page ------------------------------------------------------------------------------------


def provenance() -> str:
    """The vitreg version, commit and date the gallery is built at."""
    import vitreg

    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=DOCS, capture_output=True, text=True
    )
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"
    day = datetime.now(timezone.utc).date().isoformat()
    return f"vitreg {vitreg.__version__}, commit `{commit}`, {day}"


def section_text(section: Section, run: Path, pictures: Sequence[Picture]) -> str:
    """The Markdown of one section: what it shows, its figures, its commands, its pictures."""
    lines = [f"## {section.title}", "", section.intro, "", section.numbers(run), ""]
    made = ", then ".join(f"`{command(argv)}`" for argv in section.commands)
    lines += [f"Made by {made}.", ""]
    for pic in pictures:
        lines += [f"![{section.key}: {pic.title}]({PICTURES}/{pic.file})", ""]
        lines += [f"**{pic.title}**: {pic.caption}", ""]
    return "\n".join(lines)


def page(texts: Sequence[str], built: str) -> str:
    """The gallery page: how it is built, then every section."""
    head = [
        "# Gallery",
        "",
        "Every picture here comes from a real run of the offline demo: synthetic ViTs with "
        "planted artifacts (random weights) on synthetic images, so they show what vitreg "
        "draws, not findings about trained models. `python docs/build_gallery.py` runs each "
        "command below as written, screenshots each report.html in headless Chromium and "
        f"writes this page; the numbers in the text are read from the runs. Built with {built}.",
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(texts)


def build(work: Path, docs: Path, browser: str | None, sections: Sequence[Section]) -> int:
    """Pictures and page from the runs in ``work``; the images' total bytes."""
    pictures = docs / PICTURES
    shutil.rmtree(pictures, ignore_errors=True)
    pictures.mkdir(parents=True)
    texts = []
    for section in sections:
        run = work / section.run
        texts.append(section_text(section, run, section_pictures(section, run, pictures, browser)))
    (docs / PAGE).write_text(page(texts, provenance()), encoding="utf-8")
    return check_budget(pictures)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, help="folder for the runs (default: a temporary one)")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="take the runs already in --work instead of running the commands (pictures and "
        "page only: for changes to this script, not to vitreg)",
    )
    args = ap.parse_args(argv)
    if args.reuse and args.work is None:
        ap.error("--reuse needs --work, the folder that holds the runs")
    browser = find_browser()
    if browser is None:
        raise SystemExit("the gallery's screenshots need Chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if not args.reuse:
            run_commands(SECTIONS, work)
        total = build(work, DOCS, browser, SECTIONS)
    print(f"wrote {DOCS / PAGE} and {DOCS / PICTURES}/ ({total:,} bytes of images)")


if __name__ == "__main__":
    main()
