"""The report of ``vitreg experiment sae``: the three arms side by side (reconstruction error on
ordinary patches, dead latents, outlier latents, share of the loss on outlier tokens), each a
mean over seeds with its 95% interval, the chart of the four, and what they mean."""

from __future__ import annotations

from pathlib import Path

from vitreg.core.intervals import interval_verdict
from vitreg.report.document import Headline, build_document
from vitreg.report.render.envelope import (
    data_section,
    model_section,
    provenance_section,
    synthetic_banner,
)
from vitreg.report.render.markdown import Report, Section, Table, figure_section, num, pct
from vitreg.report.render.plots import Figure, figure, new_canvas
from vitreg.report.writer import write_run
from vitreg.results.sae import MEASURES, SaeArm, SaeResults, SeedMeasure
from vitreg.results.schema import DataInfo, Envelope, ModelInfo
from vitreg.settings.base import ConfigFile

#: each measure: its label, whether it is a share (shown in %), and higher is better
LABELS = {
    "ordinary_error": ("error on ordinary patches (FVU)", False),
    "dead_latents": ("dead latents", True),
    "outlier_latents": ("outlier latents", True),
    "outlier_loss_share": ("loss share on outlier tokens", True),
}
ARM_TITLES = {
    "raw": "(a) raw",
    "excluded": "(b) outliers excluded",
    "fixed": "(c) fixed model",
}
COLORS = {"raw": "#c0504d", "excluded": "#4f81bd", "fixed": "#9bbb59"}


def shown(m: SeedMeasure | None, share: bool) -> str:
    """``mean ± half-width`` (in % for a share; the mean alone for one seed, – for none)."""
    if m is None or m.mean is None:
        return "–"
    fmt = pct if share else num
    return f"{fmt(m.mean)} ± {fmt(m.ci95)}" if m.ci95 is not None else fmt(m.mean)


def arms_table(r: SaeResults) -> Table:
    """The arms side by side: one row per measure."""
    header = ["measure (held-out images)", *(ARM_TITLES[a.name] for a in r.arms)]
    rows = [[LABELS[m][0], *(shown(getattr(a, m), LABELS[m][1]) for a in r.arms)] for m in MEASURES]
    tokens = [str(round(sum(a.train_tokens) / len(a.train_tokens))) for a in r.arms]
    rows.append(["training tokens (mean per seed)", *tokens])
    return Table(header, rows)


def console_lines(r: SaeResults) -> list[str]:
    """One line per arm: its error on ordinary patches, outlier latents and loss share."""
    return [
        f"{ARM_TITLES[a.name]}: "
        + "; ".join(
            f"{LABELS[m][0]} {shown(getattr(a, m), LABELS[m][1])}"
            for m in ("ordinary_error", "outlier_latents", "outlier_loss_share")
            if getattr(a, m) is not None
        )
        for a in r.arms
    ]


def arm(r: SaeResults, name: str) -> SaeArm:
    """The arm called ``name``."""
    return next(a for a in r.arms if a.name == name)


def reading(r: SaeResults) -> list[str]:
    """What the numbers say, each comparison called only where the 95% intervals separate."""
    raw, excluded, fixed = arm(r, "raw"), arm(r, "excluded"), arm(r, "fixed")
    lines = []
    share, loss = r.outlier_tokens, raw.outlier_loss_share
    if loss is not None and loss.mean is not None and share.mean is not None:
        ratio = loss.mean / share.mean if share.mean > 0 else float("inf")
        lines.append(
            f"In the raw arm, outlier tokens are {pct(share.mean)} of the held-out patch tokens "
            f"and take {pct(loss.mean)} of the SAE's squared error ({num(ratio, 2)}× their "
            "share)."
        )
    for other in (excluded, fixed):
        parts = []
        for m in ("ordinary_error", "dead_latents", "outlier_latents"):
            a, b = getattr(raw, m), getattr(other, m)
            verdict = interval_verdict((a.mean, a.ci95), (b.mean, b.ci95), False)
            parts.append(
                f"{LABELS[m][0]}: {verdict} ({shown(b, LABELS[m][1])} vs {shown(a, LABELS[m][1])})"
            )
        lines.append(f"{ARM_TITLES[other.name]} against (a) raw — " + "; ".join(parts) + ".")
    return lines


DEFINITIONS = (
    "Outlier tokens: patch tokens whose norm in the raw model at {site} is above {cut} "
    "({rule}); the same positions count as outlier positions in the fixed model. Ordinary "
    "patches: every other patch token. Error on ordinary patches: squared reconstruction error "
    "over the total variance of the held-out ordinary patches (fraction of variance unexplained; "
    "arms a and b on the raw model's tokens, arm c on the fixed model's tokens of the same "
    "images and positions). Dead latents: never active on the arm's held-out patch tokens. "
    "Outlier latents: more than half of the held-out tokens a latent fires on are outlier "
    "tokens (counted, not weighted: an outlier's norm gives every latent it touches a large "
    "activation). Loss share: squared error on outlier positions over the squared error on all "
    "held-out patch tokens (arm b never trains on an outlier token, so it has none)."
)
RECIPE = (
    "The same TopK SAE in every arm: {latents} latents ({expansion}× the width), k = {k}, "
    "{steps} Adam steps (lr {lr}) of {tokens} tokens, inputs scaled so that the training "
    "tokens' mean squared norm is the width. {seeds} seeds; each draws its own split of the "
    "{n} images ({held} held out) and its own initialisation and minibatches, the same for the "
    "three arms. ± is the Student-t 95% half-width over the seeds; a comparison is called only "
    "where the two intervals do not overlap."
)


def report(doc: Envelope, figures: list[Figure]) -> Report:
    """The study's report from its typed document."""
    r: SaeResults = doc.results
    s = r.sae
    summary = Section("summary", "Summary")
    summary.blocks.append(
        f"Three arms, the same SAE recipe, at `{r.site}`: (a) the raw model's patch tokens, "
        "(b) the same without the outlier tokens, (c) the patch tokens of the model fixed with "
        f"test-time registers ({r.neurons.n_neurons} register neurons, {r.neurons.source})."
    )
    summary.blocks.append(arms_table(r))
    summary.blocks += reading(r)
    method = Section("method", "Definitions and recipe")
    method.blocks.append(
        DEFINITIONS.format(site=f"`{r.site}`", cut=num(r.outlier_threshold), rule=r.outlier_rule)
    )
    method.blocks.append(
        RECIPE.format(
            latents=r.n_latents,
            expansion=s.expansion,
            k=s.k,
            steps=s.steps,
            lr=s.lr,
            tokens=s.tokens,
            seeds=s.seeds,
            n=r.n_images,
            held=r.held_out_images,
        )  # fmt: skip
    )
    sections = [summary]
    sections += [figure_section("Figure", figures)] if figures else []
    sections += [method, data_section(doc), model_section(doc), provenance_section(doc)]
    return Report(synthetic_banner(doc), f"vitreg experiment sae: {r.site}", sections)


def arms_figure(r: SaeResults) -> Figure:
    """One panel per measure: each arm's mean with its 95% interval and the seeds' values."""
    fig = new_canvas(9.0, 2.8)
    axes = fig.subplots(1, len(MEASURES))
    for ax, m in zip(axes, MEASURES, strict=True):
        label, share = LABELS[m]
        scale = 100.0 if share else 1.0
        for i, a in enumerate(r.arms):
            value = getattr(a, m)
            if value is None or value.mean is None:
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7, color="0.4")
                continue
            err = [[(value.ci95 or 0.0) * scale]] * 2
            ax.bar(i, value.mean * scale, color=COLORS[a.name], yerr=err, capsize=3)
            seeds = [v * scale for v in value.values if v is not None]
            ax.scatter([i] * len(seeds), seeds, s=6, color="0.2", zorder=3)
        if m == "outlier_loss_share" and r.outlier_tokens.mean is not None:
            ax.axhline(r.outlier_tokens.mean * scale, color="0.4", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(r.arms)), [a.name for a in r.arms], fontsize=7)
        ax.set_title(label + (" (%)" if share else ""), fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.12, top=0.86, wspace=0.45)
    caption = (
        "The three arms on held-out images: mean over seeds (bars), 95% interval (whiskers) and "
        "each seed (dots). Dotted line: the outlier tokens' share of the held-out patch tokens "
        "(the loss share an SAE would spend if outliers cost it no more than other tokens)."
    )
    return figure("sae_arms", caption, fig)


def headlines(results: SaeResults) -> list[Headline]:
    """The headline numbers: the raw arm's loss share on outliers, and each arm's error on
    ordinary patches and outlier latents."""
    marks = [
        Headline(
            "raw_outlier_loss_share",
            "/results/arms/0/outlier_loss_share/mean",
            None,
            "raw arm: share of the SAE's squared error on outlier tokens",
        ),  # fmt: skip
        Headline(
            "outlier_tokens",
            "/results/outlier_tokens/mean",
            None,
            "share of held-out patch tokens that are outliers",
        ),  # fmt: skip
    ]
    for i, a in enumerate(results.arms):
        marks.append(
            Headline(
                f"{a.name}_ordinary_error",
                f"/results/arms/{i}/ordinary_error/mean",
                False,
                f"{a.name} arm: FVU on held-out ordinary patches",
            )  # fmt: skip
        )
        marks.append(
            Headline(
                f"{a.name}_outlier_latents",
                f"/results/arms/{i}/outlier_latents/mean",
                False,
                f"{a.name} arm: share of latents firing mainly on outlier tokens",
            )  # fmt: skip
        )
    return marks


def write_sae_run(
    out_dir: str | Path,
    results: SaeResults,
    *,
    described: ModelInfo,
    data: DataInfo,
    config: ConfigFile,
    command: str,
) -> Envelope:
    """config.yaml, report.md/html with the chart of the arms and (last) metrics.json of one
    study in ``out_dir``; the typed document written."""
    doc = build_document(
        "sae",
        results.model_dump(mode="json"),
        headlines,
        command=command,
        described=described,
        data=data,
        config=config.to_file(),
        typed=results,
    )
    write_run(out_dir, doc, report, lambda: [arms_figure(doc.results)])
    return doc
