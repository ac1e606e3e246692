"""Make the golden runs that tests/report/test_report_golden.py re-renders with `vitreg report`.

Run by hand (not by pytest), from the repository root, with the code whose reports are golden:

    PYTHONPATH=src .venv/bin/python tests/report/_golden/make_runs.py

(about four minutes on two CPU cores). It runs each verb through the CLI on the offline demo
models with tiny settings, in a scratch folder and with relative paths (so that no path of this
machine ends up in a report), then replaces every folder under tests/report/_golden/ with what
`vitreg report` reads (the document, figures/figures.json, the PNGs it lists,
figures/slider.json; a comparison's member runs' metrics.json) and the pages the run wrote.
config.yaml, the manifest and the lock are left out: re-rendering reads none of them (a folder
without a manifest is only locked). The PNGs are stored recompressed at the highest zlib level:
the same pixels, mode and chunks (the HTML embeds them re-encoded, the Markdown links them).
Last, it renders a copy of every new folder again, as the test does, and replaces the golden
folders only if each page comes out as the run first wrote it.

The `compare` run names its runs by relative paths (``diagnose``, ``diagnose_models``...),
which `vitreg report` reads from its working directory: the test renders from a copy of the
golden folder. The two schema 1.1 runs are tests/report/schema_1_1_*.json, their pages rendered
by `vitreg report` (no test holds a schema 1.0 document to copy).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
PAGES = ("report.md", "comparison.md", "leaderboard.md", "report.html")
DOCUMENTS = ("metrics.json", "comparison.json", "leaderboard.json")
DIAGNOSE = ["--img-size", "56", "--limit", "2", "--batch-size", "2", "--max-maps", "1"]
PROMPT = "What is in the image?"
# the golden folders, each made by the command of the same name below; comparisons last (they
# read the runs before them)
RUNS = (
    "diagnose",
    "neurons",
    "fix",
    "fix_board",  # fix --method: a leaderboard
    "probe",
    "train",
    "experiment",
    "sae",  # experiment sae
    "vlm",
    "export",
    "schema_1_1_diagnose",  # a 1.1 document, rendered by `vitreg report` alone
    "schema_1_1_fix",
    "diagnose_models",  # diagnose --models: a comparison with its per-model runs inside
    "compare",  # compare --out: a comparison naming runs beside it
)


def cli(*args: str) -> None:
    """``vitreg ARGS`` in this process; exits with its output unless it succeeds."""
    from typer.testing import CliRunner

    from vitreg.cli.app import app

    print("vitreg", " ".join(args), flush=True)
    result = CliRunner().invoke(app, list(args))
    if result.exit_code != 0:
        sys.exit(f"vitreg {' '.join(args)} failed:\n{result.output}")


def make_runs() -> None:
    """Every run, in the working directory (relative paths throughout)."""
    import vitreg
    from vitreg.fix.neuron_set import NeuronSet
    from vitreg.testing.planted import save_tiny_llava

    cli("diagnose", "planted:dinov2_s14", *DIAGNOSE, "--out", "diagnose")
    cli("neurons", "planted:dinov2_s14", "--img-size", "112", "--limit", "8",
        "--batch-size", "4", "--out", "neurons")  # fmt: skip
    cli("fix", "planted:dinov2_s14", "--neurons", "neurons/neurons.json", "--img-size", "56",
        "--limit", "2", "--batch-size", "2", "--out", "fix")  # fmt: skip
    cli("fix", "planted:clip_t16", "--method", "ttr,naclip", "--img-size", "112", "--limit", "8",
        "--batch-size", "4", "--out", "fix_board")  # fmt: skip
    cli("probe", "planted:dinov2_s14", "--img-size", "28", "--data", "synthetic-cls:n=8,size=28",
        "--epochs", "1", "--seeds", "1", "--cache", "cache", "--out", "probe")  # fmt: skip
    cli("train", "vit_tiny_patch16_224", "--data", "synthetic-cls:n=8,size=32", "--steps", "1",
        "--batch-size", "4", "--img-size", "32", "--model-arg", "depth=1", "--out", "train")  # fmt: skip
    cli("experiment", "variants", "--data", "synthetic:n=8,size=32", "--size", "tiny",
        "--steps", "1", "--batch-size", "4", "--out", "experiment")  # fmt: skip
    cli("experiment", "sae", "planted:dinov2_s14", "--neurons", "neurons/neurons.json",
        "--img-size", "112", "--limit", "8", "--batch-size", "4", "--steps", "5", "--seeds", "2",
        "--out", "sae")  # fmt: skip
    llava = save_tiny_llava("llava", img_size=64)
    units = json.loads((llava / "vitreg_planted.json").read_text())["ground_truth"]["units"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tower = vitreg.load("hf-vlm:llava")
    NeuronSet.from_pairs(units, tower).save(Path("truth"))  # its ground truth: truth.json
    cli("vlm", "hf-vlm:llava", "--prompt", PROMPT, "--neurons", "truth.json",
        "--max-new-tokens", "2", "--limit", "2", "--out", "vlm")  # fmt: skip
    cli("export", "planted:dinov2_s14", "--img-size", "56", "--limit", "3", "--batch-size", "2",
        "--shard-size", "2", "--layers", "3,9", "--exclude", "outliers", "--out", "export")  # fmt: skip
    for name in ("schema_1_1_diagnose", "schema_1_1_fix"):
        Path(name).mkdir()
        shutil.copy(TESTS / "report" / f"{name}.json", Path(name) / "metrics.json")
        cli("report", name)
    cli("diagnose", "--models", "planted:dinov2_s14,planted:dinov2_s14_reg4", *DIAGNOSE,
        "--out", "diagnose_models")  # fmt: skip
    cli("compare", "diagnose", "diagnose_models", "probe", "fix", "--out", "compare")


def needed(run: Path) -> list[str]:
    """The files of ``run`` that `vitreg report` reads, and the pages it writes, relative to
    ``run``. A comparison draws its figures again from its runs' documents: it needs those
    (the per-model runs of ``diagnose --models``; `compare`'s are golden runs themselves)."""
    files = [p for p in (*DOCUMENTS, *PAGES) if (run / p).is_file()]
    if (run / "comparison.json").is_file():
        doc = json.loads((run / "comparison.json").read_text())
        if doc["verb"] == "diagnose":
            files += [f"{m['run_dir']}/metrics.json" for m in doc["runs"]]
        return files
    figures = run / "figures"
    if (figures / "figures.json").is_file():
        files.append("figures/figures.json")
        listed = json.loads((figures / "figures.json").read_text())
        files += [f"figures/{f['name']}.png" for f in listed]
    if (figures / "slider.json").is_file():
        files.append("figures/slider.json")
    return files


def chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """The chunks of ``png`` other than its image data, in order: (type, data)."""
    found, at = [], 8
    while at < len(png):
        size = int.from_bytes(png[at : at + 4], "big")
        kind = png[at + 4 : at + 8]
        if kind != b"IDAT":
            found.append((kind, png[at + 8 : at + 8 + size]))
        at += 12 + size
    return found


def smaller_png(data: bytes) -> bytes:
    """``data`` with its image data at the highest zlib level: the same pixels, mode, text and
    resolution chunks (whichever of the two is smaller)."""
    from PIL import Image, PngImagePlugin

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        text = PngImagePlugin.PngInfo()
        for key, value in img.text.items():
            text.add_text(key, value)
        buf = io.BytesIO()
        img.save(buf, format="PNG", optimize=True, pnginfo=text, dpi=img.info.get("dpi"))
    small = buf.getvalue()
    with Image.open(io.BytesIO(small)) as again, Image.open(io.BytesIO(data)) as first:
        same = again.mode == first.mode and again.tobytes() == first.tobytes()
    return small if same and chunks(small) == chunks(data) and len(small) < len(data) else data


def store(scratch: Path, golden: Path) -> None:
    """The golden folders in ``golden``: each one's files from its run in ``scratch``."""
    for name in RUNS:
        for rel in needed(scratch / name):
            data = (scratch / name / rel).read_bytes()
            if rel.endswith(".png"):
                data = smaller_png(data)
            (golden / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden / name / rel).write_bytes(data)


def check(golden: Path) -> None:
    """Render a copy of every folder in ``golden`` again, as the test does (from the copy, so
    that `compare` finds its runs): exits unless every stored file is what it renders."""
    from typer.testing import CliRunner

    from vitreg.cli.app import app

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "golden"
        shutil.copytree(golden, copy)
        before = os.getcwd()
        os.chdir(copy)
        try:
            for name in RUNS:
                result = CliRunner().invoke(app, ["report", name])
                if result.exit_code != 0:
                    sys.exit(f"vitreg report {name} failed:\n{result.output}")
                for path in sorted((golden / name).rglob("*")):
                    rel = path.relative_to(golden)
                    if path.is_file() and (copy / rel).read_bytes() != path.read_bytes():
                        sys.exit(f"{rel} is not rendered again the same: nothing replaced")
        finally:
            os.chdir(before)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VITREG_PROGRESS", "off")
    import torch

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        scratch, golden = Path(tmp) / "runs", Path(tmp) / "golden"
        scratch.mkdir()
        before = os.getcwd()
        os.chdir(scratch)
        try:
            make_runs()
        finally:
            os.chdir(before)
        store(scratch, golden)
        check(golden)
        for old in HERE.iterdir():
            if old.is_dir() and old.name != "__pycache__":
                shutil.rmtree(old)
        for name in RUNS:
            shutil.copytree(golden / name, HERE / name)
    size = sum(p.stat().st_size for name in RUNS for p in (HERE / name).rglob("*") if p.is_file())
    print(f"{len(RUNS)} golden runs, {size / 2**20:.2f} MiB, each rendered again the same")


if __name__ == "__main__":
    main()
