"""The sections of the envelope every run has (model, images, provenance) and the banner of
a report on a model that is not a trained ViT (synthetic, random weights)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from vitreg.core.weights import WEIGHT_KINDS
from vitreg.report.render.markdown import (
    Section,
    Table,
    code,
    code_span,
    escape_text,
    inline_text,
    num,
    text,
)
from vitreg.results.schema import Envelope, RunDocument, synthetic_weights

#: the versions a document records, in the order the provenance shows them
VERSIONS = (
    "vitreg_version",
    "torch_version",
    "timm_version",
    "transformers_version",
    "open_clip_version",
    "python_version",
)


def is_random_init(doc: Envelope) -> bool:
    """Whether the run's model has random, untrained weights: its recorded weight kind, or
    ``--random-init`` in the config of runs written before the kind was recorded."""
    return doc.model.weights == "random" or bool(doc.config.get("random_init"))


def random_init_banner(name: str) -> str:
    """The banner of a report on a model with random weights (``--random-init``,
    ``pretrained=False``)."""
    return (
        f"**RANDOM WEIGHTS:** {code_span(name)} has random, untrained weights (`--random-init` or "
        "`pretrained=False`); no trained weights were loaded. Artifacts found here, or their absence, say nothing about the trained model; "
        "use this report to check the tool, not to draw conclusions about the model."
    )


def model_banner(name: str, synthetic: bool, random_init: bool, planted: str) -> str | None:
    """The banner of a report on the model ``name``: synthetic (random weights with ``planted``
    structure), else built with random weights, else none."""
    if not synthetic:
        return random_init_banner(name) if random_init else None
    return (
        f"**SYNTHETIC MODEL:** {code_span(name)} has random weights with {planted}; it is not a trained "
        "ViT. Use this report to check the tool, not to draw conclusions about real models."
    )


def synthetic_banner(doc: Envelope, planted: str = "planted register neurons") -> str | None:
    """The banner of a report on a model that is not a trained ViT: a synthetic one (random
    weights with ``planted`` structure), or one built with ``--random-init``; ``None`` for
    trained weights (``doc``: the typed document)."""
    m = doc.model
    synthetic = synthetic_weights(m.spec, m.weights, m.notes)
    return model_banner(m.spec or m.class_name or "model", synthetic, is_random_init(doc), planted)


def read_banner(doc: RunDocument, planted: str = "planted register neurons") -> str | None:
    """:func:`synthetic_banner` of a document as read, not validated (a compared run's, which
    may not follow the schema): its model block as read (KeyError, TypeError or
    AttributeError where it is not one that can be read)."""
    model, config = doc.model, doc.config
    if model is None:
        raise KeyError("model")
    name = model.get("spec") or model.get("class_name") or "model"
    random_init = model.get("weights") == "random" or bool((config or {}).get("random_init"))
    notes = model.get("notes")
    synthetic = synthetic_weights(
        model.get("spec"),  # type: ignore[arg-type]
        model.get("weights"),  # type: ignore[arg-type]
        notes,  # type: ignore[arg-type]
    )
    return model_banner(name, synthetic, random_init, planted)  # type: ignore[arg-type]


def model_section(doc: Envelope) -> Section:
    m = doc.model
    lay = m.layout
    rows = [
        ["spec", code_span(m.spec) if m.spec else "– (wrapped module)"],
        ["family / source", f"{text(m.family)} / {text(m.source or None)}"],
        ["weights", text(WEIGHT_KINDS.get(m.weights, "not recorded"))],
        ["class", code(m.class_name)],
        [
            "token layout",
            f"{lay.get('n_cls', 0)} [CLS], {lay.get('n_reg', 0)} registers, "
            f"{lay.get('n_patches', '?')} patches on a {lay.get('grid')} grid, "
            f"patch size {lay.get('patch_size')}",
        ],
        ["dimensions", ", ".join(f"{k} {num(v)}" for k, v in m.dims.items())],
        ["image size", text(m.image_size)],
        ["attention path", text(m.attention)],
    ]
    s = Section("model", "Model", [Table(["", ""], rows)])
    s.blocks += [f"Note: {inline_text(n)}" for n in m.notes]
    return s


def data_section(doc: Envelope) -> Section:
    d = doc.data
    s = Section("data", "Images")
    desc = f" (source: {inline_text(d.description)})" if d.description else ""
    s.blocks.append(f"{d.n_images} images{desc} were analysed.")
    if getattr(d, "synthetic", None):  # a field of the images' own description
        s.blocks.append(
            "The images are synthetic (generated textures with flat regions), not photos."
        )
    if d.skipped:
        s.blocks.append(f"{len(d.skipped)} files were skipped:")
        rows = [[code_span(k), escape_text(v)] for k, v in d.skipped.items()]
        s.blocks.append(Table(["file", "reason"], rows))
    else:
        s.blocks.append("No file was skipped.")
    if d.converted:
        s.blocks.append(f"{len(d.converted)} files were converted to 8-bit RGB:")
        s.blocks.append(
            Table(
                ["file", "original mode"],
                [[code_span(k), escape_text(v)] for k, v in d.converted.items()],
            )
        )
    return s


def provenance_section(doc: Envelope) -> Section:
    """The versions, creation time, command and config of the typed document ``doc``."""
    versions = {k: getattr(doc, k) for k in VERSIONS}
    return provenance_of(versions, doc.created, doc.command, doc.config)


def provenance_of(
    versions: Mapping[str, str | None],
    created: str,
    command: str,
    config: Mapping[str, JsonValue],
) -> Section:
    """The provenance section of what made a file: each of :data:`VERSIONS` (``None``: not
    installed), the creation time, the command and its config."""
    rows = [
        [k, text(versions.get(k)) if versions.get(k) is not None else "not installed"]
        for k in VERSIONS
    ]
    rows += [["created (UTC)", created], ["command", code(command)]]
    rows += [[f"config: {k}", code(v)] for k, v in config.items()]
    return Section("provenance", "Provenance", [Table(["", ""], rows)])
