"""Run directory of ``vitreg probe``: per layer, one table with *base* and *fixed* side by side
(mean ± 95% CI over seeds, and the difference), in report.md/.html and traceable metrics.json."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitreg.report.figures import Figure
from vitreg.report.markdown import (
    Report,
    Section,
    Table,
    model_section,
    num,
    provenance_section,
    text,
)
from vitreg.report.run_files import document, figure_section, synthetic_banner, write_files

CONDITION_TITLES = {"base": "base", "fixed": "fixed"}
# a score's verdict against a yardstick, as read in the table
READ = {
    "better": "beats",
    "worse": "trails",
    "within noise": "within noise of",
    "no interval": "no interval vs",
}


def task_and_data(results: dict[str, Any]) -> str:
    """``task/data`` of a probe run (``classification/synthetic-cls:n=200``): the start of its
    metric names, so that scores of other tasks or datasets never share a row in a comparison."""
    data = results.get("data") if isinstance(results.get("data"), dict) else {}
    specs = [
        str(split.get("spec"))
        for split in (data.get("train"), data.get("test"))
        if isinstance(split, dict) and split.get("spec") is not None
    ]
    return f"{results.get('task')}/{'+'.join(dict.fromkeys(specs)) or 'unknown data'}"


def headlines(results: dict[str, Any]) -> list[tuple]:
    """One headline per score: ``task/data/condition/layer/feature/group/metric`` -> its mean."""
    out = []
    prefix = task_and_data(results)
    for condition, per_layer in results["conditions"].items():
        for li, layer in enumerate(per_layer):
            for si, s in enumerate(layer["scores"]):
                name = (
                    f"{prefix}/{condition}/{layer['layer']}/{s['feature']}/{s['group']}/"
                    f"{s['metric']}"
                )
                pointer = f"/results/conditions/{condition}/{li}/scores/{si}/mean"
                out.append((name, pointer, s["higher_is_better"], {}))
    return out


def data_block(run: dict[str, Any]) -> dict[str, Any]:
    """The metrics.json ``data`` block: both splits, samples used, skips and repairs by reason,
    and the datasets' warnings (e.g. one class only), each prefixed with its split."""
    caches = run["caches"]
    skipped: dict[str, str] = {}
    for stage, c in caches.items():
        for reason, n in c["skipped"].items():
            skipped[f"{stage}: {reason}"] = f"{n} samples skipped"
        for reason, n in c.get("repairs", {}).items():
            skipped[f"{stage}: {reason}"] = f"{n} pixels set to ignore/invalid"
    train, test = run["data"]["train"], run["data"]["test"]
    for split, d in (("train", train), ("test", test)):
        for reason, n in d.get("listing", {}).items():
            skipped[f"{split} listing: {reason}"] = f"{n} files not read"
    condition = next(iter(caches), "base").split("/")[0]
    return {
        "description": f"train: {train.get('spec')} ({train.get('split')}), "
        f"test: {test.get('spec')} ({test.get('split')})",
        "n_images": sum(c["n"] for s, c in caches.items() if s.split("/")[0] == condition),
        "skipped": skipped,
        "warnings": [
            f"{s}: {w}"
            for s, d in (("train", train), ("test", test))
            for w in d.get("warnings", [])
        ],
        "train": train,
        "test": test,
    }


def _cell(score: dict[str, Any] | None) -> str:
    if score is None or score["mean"] is None:
        return "–"
    ci = score["ci95"]
    return f"{num(score['mean'])} ± {num(ci)}" if ci is not None else num(score["mean"])


def _delta(delta: dict[str, Any] | None) -> str:
    """fixed − base and its verdict: better/worse only when the 95% intervals separate."""
    if delta is None:
        return "–"
    return f"{delta['delta']:+.3g} ({delta['verdict']})"


def _vs_yardsticks(by: dict[str, dict[str, Any]]) -> str:
    """Per condition, the yardsticks a score does not clearly beat (or "beats all")."""
    parts = []
    for c, s in by.items():
        marks = s.get("vs_yardsticks", {})
        if not marks:
            continue
        short = {n: v for n, v in marks.items() if v != "better"}
        text = "; ".join(f"{READ[v]} {n}" for n, v in short.items()) or "beats all"
        parts.append(f"{c}: {text}")
    return " · ".join(parts) or "–"


def yardstick_table(layer: dict[str, Any]) -> Table | None:
    """The trivial baselines of one layer's metrics, with how each was computed."""
    rows = [
        [y["name"], y["metric"], y["group"], num(y["value"]), y["description"]]
        for y in layer.get("yardsticks", [])
    ]
    return Table(["yardstick", "metric", "tokens", "value", "how"], rows) if rows else None


def class_iou_table(layers: dict[str, dict[str, Any]]) -> Table | None:
    """Segmentation: IoU of each class per condition (mean over seeds) and its test pixels."""
    per = {c: layer["info"].get("per_class") for c, layer in layers.items()}
    if not all(per.values()):
        return None
    first = next(iter(per.values()))
    rows = [
        [str(row["class"]), str(row["test_pixels"]), *(num(per[c][i]["iou"]) for c in per)]
        for i, row in enumerate(first)
    ]
    return Table(["class", "test pixels", *(f"IoU {c}" for c in per)], rows)


def layer_section(results: dict[str, Any], li: int) -> Section:
    """The side-by-side table of one layer with the Δ verdicts and each score against the
    yardsticks, the yardsticks themselves, per-class IoU (segmentation), and the notes."""
    conditions = list(results["conditions"])
    layers = {c: results["conditions"][c][li] for c in conditions}
    first = layers[conditions[0]]
    keyed: dict[tuple, dict[str, Any]] = {}
    for c, layer in layers.items():
        for s in layer["scores"]:
            keyed.setdefault((s["feature"], s["group"], s["metric"]), {})[c] = s
    deltas = {
        (d["feature"], d["group"], d["metric"]): d
        for d in results.get("deltas", [])
        if d["layer"] == first["layer"]
    }
    header = ["feature", "tokens", "metric", *conditions]
    header += ["Δ (fixed − base)"] if len(conditions) == 2 else []
    header += ["vs yardsticks"]
    rows = []
    for key, by in keyed.items():
        feature, group, metric = key
        s = next(iter(by.values()))
        arrow = "↑" if s["higher_is_better"] else "↓"
        row = [f"`{feature}`", group, f"{metric} {arrow}", *(_cell(by.get(c)) for c in conditions)]
        if len(conditions) == 2:
            row.append(_delta(deltas.get(key)))
        rows.append([*row, _vs_yardsticks(by)])
    sec = Section(f"layer-{li}", f"Layer `{first['layer']}`", [Table(header, rows)])
    if len(conditions) == 2:
        sec.blocks.append(
            "A Δ is called better or worse only when the two 95% intervals do not overlap; "
            "otherwise it is within noise (no interval: one seed, nothing can be said)."
        )
    marks = yardstick_table(first)
    if marks is not None:
        sec.blocks += ["Yardsticks (what a probe that learned nothing scores on this test split):"]
        sec.blocks.append(marks)
    classes = class_iou_table(layers)
    if classes is not None:
        sec.blocks += ["IoU per class:", classes]
    notes: dict[str, list[str]] = {}
    for c, layer in layers.items():
        for n in layer["notes"]:
            notes.setdefault(n, []).append(c)
    sec.blocks += [f"Note ({', '.join(cs)}): {n}" for n, cs in notes.items()]
    return sec


def probe_report(doc: dict[str, Any], figures: Sequence[Figure] = ()) -> Report:
    """The probe run's report: summary, one section per layer, figures, data, model."""
    results = doc["results"]
    task = results["task"]
    intro = Section("summary", "Summary")
    how = (
        f"Means over seeds {results['seeds']} with Student-t 95% confidence half-widths; the "
        "learning rate of each seed is chosen on a held-out part of the train split, scores are "
        "on the test split."
        if results["seeds"]
        else "Nothing is trained: one score per condition, computed on the test split."
    )
    intro.blocks.append(f"Task **{task}**: {results['description']}. {how}")
    if "fixed" in results["conditions"]:
        fix = results.get("fix") or {}
        settings = "; ".join(f"{k} {text(v)}" for k, v in fix.items() if k != "name")
        intro.blocks.append(
            f"*fixed* = the same model under {fix.get('name', 'the fix')}: {settings or '–'}."
        )
    reused = [s for s, c in results["caches"].items() if c["forward_passes"] == 0]
    if reused:
        intro.blocks.append(
            f"Features reused from the cache (no forward pass): {', '.join(reused)}."
        )
    replaced = [
        f"{stage}: {n} ({reason})"
        for stage, c in results["caches"].items()
        for reason, n in c.get("replaced", {}).items()
    ]
    if replaced:
        intro.blocks.append(
            "Cache shards found damaged on disk and extracted again: " + ", ".join(replaced) + "."
        )
    sections = [intro]
    n_layers = len(next(iter(results["conditions"].values())))
    sections += [layer_section(results, li) for li in range(n_layers)]
    data = Section("data", "Data")
    rows = [[k, v] for k, v in doc["data"]["skipped"].items()]
    data.blocks.append(doc["data"]["description"])
    for warning in doc["data"].get("warnings", []):
        data.blocks.append(f"**Warning** — {warning}")
    data.blocks.append(
        Table(["what", "count"], rows) if rows else "No sample was skipped or repaired."
    )
    sections += [figure_section("Figures", list(figures))] if figures else []
    sections += [data, model_section(doc), provenance_section(doc)]
    return Report(synthetic_banner(doc), f"vitreg probe: {task}", sections)


def write_probe_run(
    out_dir: str | Path,
    results: dict[str, Any],
    described: dict[str, Any],
    config: dict[str, Any],
    command: str,
    figures: Sequence[Figure] = (),
) -> Path:
    """Write figures, config.yaml, report.md, report.html and (last) metrics.json of one probe
    run."""
    doc = document(
        "probe", command, described, data_block(results), config, results, headlines(results)
    )
    return write_files(Path(out_dir), doc, probe_report(doc, figures), list(figures))
