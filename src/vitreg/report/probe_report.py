"""Run directory of ``vitreg probe``: per layer, one table with *base* and *fixed* side by side
(mean ± 95% CI over seeds, and the difference), in report.md/.html and traceable metrics.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitreg.report.markdown import Report, Section, Table, model_section, num, provenance_section
from vitreg.report.run_files import document, synthetic_banner, write_files

CONDITION_TITLES = {"base": "base", "fixed": "fixed"}


def headlines(results: dict[str, Any]) -> list[tuple]:
    """One headline per score: ``condition/layer/feature/group/metric`` -> its mean."""
    out = []
    for condition, per_layer in results["conditions"].items():
        for li, layer in enumerate(per_layer):
            for si, s in enumerate(layer["scores"]):
                name = f"{condition}/{layer['layer']}/{s['feature']}/{s['group']}/{s['metric']}"
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


def _delta(base: dict[str, Any] | None, fixed: dict[str, Any] | None) -> str:
    if not base or not fixed or base["mean"] is None or fixed["mean"] is None:
        return "–"
    d = fixed["mean"] - base["mean"]
    better = (d > 0) == base["higher_is_better"] if d else None
    mark = "" if better is None else (" (better)" if better else " (worse)")
    return f"{d:+.3g}{mark}"


def layer_section(results: dict[str, Any], li: int) -> Section:
    """The side-by-side table of one layer, and the notes of each condition."""
    conditions = list(results["conditions"])
    layers = {c: results["conditions"][c][li] for c in conditions}
    first = layers[conditions[0]]
    keyed: dict[tuple, dict[str, Any]] = {}
    for c, layer in layers.items():
        for s in layer["scores"]:
            keyed.setdefault((s["feature"], s["group"], s["metric"]), {})[c] = s
    header = ["feature", "tokens", "metric", *conditions]
    header += ["Δ (fixed − base)"] if len(conditions) == 2 else []
    rows = []
    for (feature, group, metric), by in keyed.items():
        s = next(iter(by.values()))
        arrow = "↑" if s["higher_is_better"] else "↓"
        row = [f"`{feature}`", group, f"{metric} {arrow}", *(_cell(by.get(c)) for c in conditions)]
        if len(conditions) == 2:
            row.append(_delta(by.get("base"), by.get("fixed")))
        rows.append(row)
    sec = Section(f"layer-{li}", f"Layer `{first['layer']}`", [Table(header, rows)])
    notes: dict[str, list[str]] = {}
    for c, layer in layers.items():
        for n in layer["notes"]:
            notes.setdefault(n, []).append(c)
    sec.blocks += [f"Note ({', '.join(cs)}): {n}" for n, cs in notes.items()]
    return sec


def probe_report(doc: dict[str, Any]) -> Report:
    results = doc["results"]
    task = results["task"]
    intro = Section("summary", "Summary")
    intro.blocks.append(
        f"Task **{task}**: {results['description']}. Means over seeds {results['seeds']} with "
        "Student-t 95% confidence half-widths; the learning rate of each seed is chosen on a "
        "held-out part of the train split, scores are on the test split."
    )
    if "fixed" in results["conditions"]:
        fix = results.get("fix") or {}
        intro.blocks.append(f"*fixed* = the same model under {fix.get('name', 'the fix')}: {fix}.")
    reused = [s for s, c in results["caches"].items() if c["forward_passes"] == 0]
    if reused:
        intro.blocks.append(
            f"Features reused from the cache (no forward pass): {', '.join(reused)}."
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
    sections += [data, model_section(doc), provenance_section(doc)]
    return Report(synthetic_banner(doc), f"vitreg probe: {task}", sections)


def write_probe_run(
    out_dir: str | Path,
    results: dict[str, Any],
    described: dict[str, Any],
    config: dict[str, Any],
    command: str,
) -> Path:
    """Write config.yaml, report.md, report.html and (last) metrics.json of one probe run."""
    doc = document(
        "probe", command, described, data_block(results), config, results, headlines(results)
    )
    return write_files(Path(out_dir), doc, probe_report(doc), [])
