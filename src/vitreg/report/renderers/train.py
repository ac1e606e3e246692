"""The report of ``vitreg train`` and its run directory: steps, losses, the weights and the
data, in the same envelope as every verb (config.yaml, metrics.json, report.md/html with the
loss curve; the step log is log.jsonl). A DINO run's report reads its [CLS] loss against the teacher's entropy."""

from __future__ import annotations

from pathlib import Path

from vitreg.report.document import Headline, build_document
from vitreg.report.render.envelope import model_section, provenance_section, synthetic_banner
from vitreg.report.render.markdown import Report, Section, figure_section, inline_text, num, text
from vitreg.report.render.plots import Figure, figure, new_canvas
from vitreg.report.writer import write_run
from vitreg.results.schema import DataInfo, Envelope, ModelInfo
from vitreg.results.train import DinoTerms, TrainResults
from vitreg.settings.base import ConfigFile

PARTS = ("loss_dino", "loss_ibot")  # the terms a DINO run's loss is the sum of


def dino_reading(terms: DinoTerms) -> str:
    """The [CLS] DINO loss of a run in words, with its measured figures (from
    :func:`vitreg.train.dino.loss_terms`): is its level the teacher's entropy or a gap the
    student has not closed?"""
    low, end, ln_k = terms.lowest, terms.final, terms.ln_out_dim
    text = (
        f"The [CLS] DINO loss fell to {num(low.loss_dino)} at step {low.step} and ended at "
        f"{num(end.loss_dino)} (step {end.step}). It is the teacher's entropy, "
        f"{num(end.teacher_entropy)} at the end (a uniform teacher over {terms.out_dim} "
        f"prototypes has ln {terms.out_dim} = {num(ln_k)}), plus KL(teacher ‖ student), "
        f"{num(end.kl)}."
    )
    if end.teacher_entropy is None:
        return text
    if end.teacher_entropy < 0.9 * ln_k:
        return text + " The teacher is well below uniform: its outputs tell images apart."
    return text + (
        " So the rise is the teacher becoming nearly uniform, not the student failing to follow "
        "it. At first every image gets almost the same [CLS] output, which the sharpened, not "
        "yet centred teacher turns into one confident guess that the student learns at once "
        "(the low point); the centre (an EMA of the teacher's outputs) then catches up and "
        "subtracts that shared output, and what is left differs too little between images to "
        "be sharpened. This is DINO's centring doing its job (it stops the collapse onto one "
        "prototype), not a defect; the teacher becomes informative once the backbone tells "
        "images apart, which takes longer than this run. A flat [CLS] term says nothing about "
        "collapsed features: the iBOT patch term keeps teaching, and the probes measure them."
    )


def loss_figure(history: list[dict[str, float]], terms: DinoTerms | None) -> Figure:
    """The training loss per step (a DINO run: its [CLS] and iBOT terms and the teacher's
    entropy against ln(out_dim) too), with the learning rate on a second axis."""
    steps = [r["step"] for r in history]
    fig = new_canvas(7.0, 3.6)
    ax = fig.subplots()
    ax.plot(steps, [r["loss"] for r in history], lw=1.2, label="loss")
    for key in PARTS:
        if all(key in r for r in history):
            ax.plot(steps, [r[key] for r in history], lw=1, label=key)
    if terms is not None:
        entropy = [r.get("teacher_entropy") for r in history]
        ax.plot(steps, entropy, lw=1, linestyle="--", label="teacher entropy ([CLS])")
        ax.axhline(terms.ln_out_dim, color="0.5", linestyle=":", linewidth=1)
        ax.annotate(f"ln {terms.out_dim} (uniform)", (steps[0], terms.ln_out_dim),
                    fontsize=7, color="0.4", va="bottom")  # fmt: skip
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats)")
    lr = ax.twinx()
    lr.plot(steps, [r["lr"] for r in history], color="0.6", lw=0.8, label="lr")
    lr.set_ylabel("learning rate", color="0.4")
    ax.legend(loc="upper left", bbox_to_anchor=(1.16, 1.0), borderaxespad=0.0, fontsize=8)
    caption = (
        "Training loss per optimizer step"
        + (
            ": the total, its [CLS] DINO and iBOT terms, and the [CLS] teacher's entropy (dashed; "
            "the dotted line is a uniform teacher)"
            if terms is not None
            else ""
        )
        + "; the learning rate in grey on the right axis."
    )
    return figure("training_loss", caption, fig)


def report(doc: Envelope, figures: list[Figure]) -> Report:
    """The training run's report from its typed document: what was trained and how the loss
    went, the curve, the model."""
    r: TrainResults = doc.results
    summary = Section("summary", "Summary")
    done = f"{r.steps} of {text(r.total_steps)} optimizer steps"
    resumed = f", resumed from step {r.resumed_from}" if r.resumed_from is not None else ""
    summary.blocks.append(
        f"Recipe **{r.recipe}**: {done}{resumed}; loss {num(r.loss_first)} at the first "
        f"step, {num(r.final_loss)} at the last. Data: {inline_text(doc.data.description)}. "
        f"Weights: {r.weights or 'not exported'}; every step's record: {r.log}."
    )
    if r.dino_terms is not None:
        summary.blocks.append(dino_reading(r.dino_terms))
    sections = [summary]
    sections += [figure_section("Figures", figures)] if figures else []
    sections += [model_section(doc), provenance_section(doc)]
    return Report(synthetic_banner(doc), f"vitreg train: {r.recipe}", sections)


def headlines(results: TrainResults) -> list[Headline]:
    """The headline numbers of a training run: its last loss and the steps done."""
    return [
        Headline("final_loss", "/results/final_loss", False, "loss at the last step"),
        Headline("steps", "/results/steps", None, "optimizer steps done"),
    ]


def write_train_run(
    out_dir: str | Path,
    results: TrainResults,
    history: list[dict[str, float]],
    *,
    described: ModelInfo,
    data: DataInfo,
    config: ConfigFile,
    command: str,
) -> Envelope:
    """config.yaml, report.md/html with the loss curve of ``history`` (the step log) and
    (last) metrics.json of a finished training run in ``out_dir``; the typed document written.

    ``results`` are the run's (:func:`vitreg.verbs.train.train_results`), ``described`` the
    model block (``vitreg.verbs.train.describe_trained``), ``data`` the data block
    (:func:`vitreg.train.data.describe_training_data`: usable samples, skips by reason,
    warnings)."""
    doc = build_document(
        "train",
        results.model_dump(mode="json"),
        headlines,
        command=command,
        described=described,
        data=data,
        config=config.to_file(),
        typed=results,
    )
    terms = doc.results.dino_terms
    write_run(out_dir, doc, report, lambda: [loss_figure(history, terms)] if history else [])
    return doc
