"""Run directory of ``vitreg probe``: per layer, one table with *base* and *fixed* side by side
(mean ± 95% CI over seeds, and the difference), in report.md/.html and traceable metrics.json."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import JsonValue

from vitreg.report.document import Headline, build_document
from vitreg.report.render.envelope import model_section, provenance_section, synthetic_banner
from vitreg.report.render.markdown import (
    Report,
    Section,
    Table,
    code,
    figure_section,
    inline_text,
    num,
    text,
)
from vitreg.report.render.plots import Figure
from vitreg.report.writer import write_run
from vitreg.results.fix import ComposedDescription, NamedFix
from vitreg.results.probe import (
    ClassIoU,
    DataSetRecord,
    ProbeDelta,
    ProbeLayer,
    ProbeResults,
    ProbeScore,
)
from vitreg.results.schema import DataInfo, Envelope, ModelInfo
from vitreg.settings.base import ConfigFile

CONDITION_TITLES = {"base": "base", "fixed": "fixed"}
# a score's verdict against a yardstick, as read in the table
READ = {
    "better": "beats",
    "worse": "trails",
    "within noise": "within noise of",
    "no interval": "no interval vs",
}


def task_and_data(results: dict[str, JsonValue]) -> str:
    """``task/data`` of a probe run (``classification/synthetic-cls:n=200``) from its results
    as read (a compared run's, which may not follow the schema): the start of its metric names,
    so that scores of other tasks or datasets never share a row in a comparison."""
    data = results.get("data")
    data = data if isinstance(data, dict) else {}
    specs = [
        str(split.get("spec"))
        for split in (data.get("train"), data.get("test"))
        if isinstance(split, dict) and split.get("spec") is not None
    ]
    return f"{results.get('task')}/{'+'.join(dict.fromkeys(specs)) or 'unknown data'}"


def typed_task_and_data(results: ProbeResults) -> str:
    """:func:`task_and_data` of a run's typed results."""
    specs = [str(d.spec) for d in (results.data.train, results.data.test) if d.spec is not None]
    return f"{results.task}/{'+'.join(dict.fromkeys(specs)) or 'unknown data'}"


def headlines(results: ProbeResults) -> list[Headline]:
    """One headline per score: ``task/data/condition/layer/feature/group/metric`` -> its mean."""
    out = []
    prefix = typed_task_and_data(results)
    for condition, per_layer in results.conditions.items():
        for li, layer in enumerate(per_layer):
            for si, s in enumerate(layer.scores):
                name = f"{prefix}/{condition}/{layer.layer}/{s.feature}/{s.group}/{s.metric}"
                pointer = f"/results/conditions/{condition}/{li}/scores/{si}/mean"
                out.append(Headline(name, pointer, s.higher_is_better))
    return out


def verdict(results: ProbeResults) -> str:
    """The run in one sentence: its best score (the task's first metric, all tokens) against the
    yardsticks, and with two conditions what the fix changed (better/worse only when the 95%
    intervals separate) and its largest change."""
    scores = [
        (c, layer.layer, s)
        for c, layers in results.conditions.items()
        for layer in layers
        for s in layer.scores
        if s.mean is not None and s.group == "all"
    ]
    if not scores:
        return "No score could be computed (see the notes of each layer)."
    if results.task == "pruning":
        return pruning_verdict(results) + _fix_sentence(results.deltas, name_group=True)
    metric = scores[0][2].metric
    ranked = [x for x in scores if x[2].metric == metric]
    sign = 1 if ranked[0][2].higher_is_better else -1
    c, layer, best = max(ranked, key=lambda x: sign * x[2].mean)
    marks = best.vs_yardsticks
    short = [f"{READ.get(v, 'not read against')} {n}" for n, v in marks.items() if v != "better"]
    against = (
        "with no yardstick to read it against"
        if not marks
        else "beats every yardstick"
        if not short
        else "; ".join(short)
    )
    where = f" at `{layer}`" if len(results.layers) > 1 else ""
    text = f"Best probe: {c} `{best.feature}`{where}, {metric} {_cell(best)}, {against}."
    return text + _fix_sentence(results.deltas)


def _fix_sentence(deltas: list[ProbeDelta], name_group: bool = False) -> str:
    """What the fix changed, in one sentence (empty without a fix); ``name_group`` names the
    token group of the largest change."""
    if not deltas:
        return ""
    counts = {v: sum(d.verdict == v for d in deltas) for v in ("better", "worse")}
    rest = len(deltas) - counts["better"] - counts["worse"]
    big = max(deltas, key=lambda d: abs(d.delta))
    group = f" ({big.group})" if name_group and big.group != "all" else ""
    return (
        f" The fix (fixed − base): {counts['better']} of {len(deltas)} scores better, "
        f"{counts['worse']} worse, {rest} within noise or without an interval; largest "
        f"change `{big.feature}`{group} {big.metric} {_delta(big)}."
    )


def pruning_verdict(results: ProbeResults) -> str:
    """Token pruning in one sentence: each ranking's score at the smallest keep ratio, best
    first, per condition, beside the score with every patch kept."""
    parts = []
    for condition, layers in results.conditions.items():
        layer = layers[0]
        ratios = layer.info.keep_ratios or []
        if not ratios:
            continue
        group = f"keep {min(ratios):.0%}"
        at = [s for s in layer.scores if s.group == group and s.mean is not None]
        full = [s for s in layer.scores if s.group == "all" and s.mean is not None]
        ranked = ", ".join(f"`{s.feature}` {_cell(s)}" for s in sorted(at, key=lambda s: -s.mean))
        every = f" (all patches {_cell(full[0])})" if full else ""
        parts.append(f"{condition}, {group} of the patches: {ranked}{every}")
    return "Pruning " + "; ".join(parts) + "."


def data_block(results: ProbeResults) -> DataInfo:
    """The metrics.json ``data`` block of the typed results: both splits, samples used, skips
    and repairs by reason, and the datasets' warnings (e.g. one class only), each prefixed with
    its split."""
    caches = results.caches
    skipped: dict[str, str] = {}
    for stage, c in caches.items():
        for reason, n in c.skipped.items():
            skipped[f"{stage}: {reason}"] = f"{n} samples skipped"
        for reason, n in (c.repairs or {}).items():
            skipped[f"{stage}: {reason}"] = f"{n} pixels set to ignore/invalid"
    splits: dict[str, DataSetRecord] = {"train": results.data.train, "test": results.data.test}
    for split, d in splits.items():
        for reason, n in (d.listing or {}).items():
            skipped[f"{split} listing: {reason}"] = f"{n} files not read"
    condition = next(iter(caches), "base").split("/")[0]
    train, test = splits["train"], splits["test"]
    return DataInfo(
        description=f"train: {train.spec} ({train.split}), test: {test.spec} ({test.split})",
        n_images=sum(c.n for s, c in caches.items() if s.split("/")[0] == condition),
        skipped=skipped,
        warnings=[f"{s}: {w}" for s, d in splits.items() for w in d.warnings or []],
        **{s: d.model_dump(mode="json") for s, d in splits.items()},
    )


def _cell(score: ProbeScore | None) -> str:
    if score is None or score.mean is None:
        return "–"
    return f"{num(score.mean)} ± {num(score.ci95)}" if score.ci95 is not None else num(score.mean)


def _delta(delta: ProbeDelta | None) -> str:
    """fixed − base and its verdict: better/worse only when the 95% intervals separate."""
    if delta is None:
        return "–"
    return f"{delta.delta:+.3g} ({delta.verdict})"


def _vs_yardsticks(by: dict[str, ProbeScore]) -> str:
    """Per condition, the yardsticks a score does not clearly beat (or "beats all")."""
    parts = []
    for c, s in by.items():
        if not s.vs_yardsticks:
            continue
        short = {n: v for n, v in s.vs_yardsticks.items() if v != "better"}
        said = "; ".join(f"{READ.get(v, text(v))} {n}" for n, v in short.items()) or "beats all"
        parts.append(f"{c}: {said}")
    return " · ".join(parts) or "–"


def yardstick_table(layer: ProbeLayer) -> Table | None:
    """The trivial baselines of one layer's metrics, with how each was computed."""
    rows = [[y.name, y.metric, y.group, num(y.value), y.description] for y in layer.yardsticks]
    return Table(["yardstick", "metric", "tokens", "value", "how"], rows) if rows else None


def class_iou_table(layers: dict[str, ProbeLayer]) -> Table | None:
    """Segmentation: IoU of each class per condition (mean over seeds) and its test pixels
    (the task's ``info.per_class``)."""
    per: dict[str, list[ClassIoU]] = {c: layer.info.per_class or [] for c, layer in layers.items()}
    if not per or not all(per.values()):
        return None
    first = next(iter(per.values()))

    def iou(rows: list[ClassIoU], i: int) -> float | None:
        return rows[i].iou if i < len(rows) else None

    rows = [
        [text(row.class_), text(row.test_pixels), *(num(iou(per[c], i)) for c in per)]
        for i, row in enumerate(first)
    ]
    return Table(["class", "test pixels", *(f"IoU {c}" for c in per)], rows)


def layer_section(results: ProbeResults, li: int) -> Section:
    """The side-by-side table of one layer with the Δ verdicts and each score against the
    yardsticks, the yardsticks themselves, per-class IoU (segmentation), and the notes."""
    layers = {c: per[li] for c, per in results.conditions.items() if li < len(per)}
    conditions = list(layers)
    first = layers[conditions[0]]
    keyed: dict[tuple, dict[str, ProbeScore]] = {}
    for c, layer in layers.items():
        for s in layer.scores:
            keyed.setdefault((s.feature, s.group, s.metric), {})[c] = s
    deltas = {(d.feature, d.group, d.metric): d for d in results.deltas if d.layer == first.layer}
    header = ["feature", "tokens", "metric", *conditions]
    header += ["Δ (fixed − base)"] if len(conditions) == 2 else []
    header += ["vs yardsticks"]
    rows = []
    for key, by in keyed.items():
        feature, group, metric = key
        arrow = " ↑" if next(iter(by.values())).higher_is_better else " ↓"
        row = [code(feature), text(group), f"{text(metric)}{arrow}"]
        row += [_cell(by.get(c)) for c in conditions]
        if len(conditions) == 2:
            row.append(_delta(deltas.get(key)))
        rows.append([*row, _vs_yardsticks(by)])
    sec = Section(f"layer-{li}", f"Layer {code(first.layer)}", [Table(header, rows)])
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
        for n in layer.notes:
            notes.setdefault(n, []).append(c)
    sec.blocks += [f"Note ({', '.join(cs)}): {n}" for n, cs in notes.items()]
    return sec


def _caches_section(results: ProbeResults) -> list[str]:
    """The summary lines on the feature cache: stages reused, damaged shards extracted again
    (each cache described as the cache wrote it)."""
    out = []
    reused = [s for s, c in results.caches.items() if c.forward_passes == 0]
    if reused:
        out.append(f"Features reused from the cache (no forward pass): {', '.join(reused)}.")
    replaced = [
        f"{stage}: {n} ({reason})"
        for stage, c in results.caches.items()
        for reason, n in (c.replaced or {}).items()
    ]
    if replaced:
        out.append(
            "Cache shards found damaged on disk and extracted again: " + ", ".join(replaced) + "."
        )
    return out


def _fix(fix: NamedFix | None) -> str:
    """The fix's name and its settings (a composition: each part's)."""
    if fix is None:
        return "the fix: –"
    if isinstance(fix, ComposedDescription):
        return " + ".join(f"({_fix(part)})" for part in fix.parts)
    settings = fix.model_dump(mode="json", exclude={"name"})
    said = "; ".join(f"{k} {text(v)}" for k, v in settings.items())
    return f"{fix.name}: {said or '–'}"


def report(doc: Envelope, figures: Sequence[Figure] = ()) -> Report:
    """The probe run's report from its typed document: summary, one section per layer,
    figures, data, model."""
    results: ProbeResults = doc.results
    intro = Section("summary", "Summary")
    how = (
        f"Means over seeds {results.seeds} with Student-t 95% confidence half-widths; the "
        "learning rate of each seed is chosen on a held-out part of the train split, scores are "
        "on the test split."
        if results.seeds
        else "Nothing is trained: one score per condition, computed on the test split."
    )
    intro.blocks.append(f"**Verdict** — {verdict(results)}")
    intro.blocks.append(f"Task **{results.task}**: {text(results.description)}. {how}")
    if "fixed" in results.conditions:
        intro.blocks.append(f"*fixed* = the same model under {_fix(results.fix)}.")
    intro.blocks += _caches_section(results)
    sections = [intro]
    n_layers = max((len(layers) for layers in results.conditions.values()), default=0)
    sections += [layer_section(results, li) for li in range(n_layers)]
    data = Section("data", "Data")
    rows = [[k, v] for k, v in doc.data.skipped.items()]
    data.blocks.append(inline_text(text(doc.data.description)))
    for warning in getattr(doc.data, "warnings", None) or []:
        data.blocks.append(f"**Warning** — {warning}")
    data.blocks.append(
        Table(["what", "count"], rows) if rows else "No sample was skipped or repaired."
    )
    sections += [figure_section("Figures", list(figures))] if figures else []
    sections += [data, model_section(doc), provenance_section(doc)]
    return Report(synthetic_banner(doc), f"vitreg probe: {results.task}", sections)


def write_probe_run(
    out_dir: str | Path,
    results: ProbeResults,
    described: ModelInfo,
    config: ConfigFile,
    command: str,
    figures: Sequence[Figure] | Callable[[], Sequence[Figure]] = (),
) -> Envelope:
    """Write config.yaml and metrics.json, then the figures (or ``figures()``, drawn after the
    results are saved), report.md and report.html of one probe run's ``results``; the
    typed document written."""
    doc = build_document(
        "probe",
        results.model_dump(mode="json"),
        headlines,
        command=command,
        described=described,
        data=data_block(results),
        config=config.to_file(),
        typed=results,
    )
    draw = figures if callable(figures) else lambda: figures
    write_run(out_dir, doc, report, draw)
    return doc
