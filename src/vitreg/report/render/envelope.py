"""The sections of the envelope every run has (model, images, provenance) and the banner of
a report on a model that is not a trained ViT (synthetic, random weights)."""

from __future__ import annotations

from typing import Any

from vitreg.core.weights import WEIGHT_KINDS
from vitreg.report.render.markdown import Section, Table, code, code_span, escape_text, num, text
from vitreg.results.schema import is_synthetic


def is_random_init(doc: dict[str, Any]) -> bool:
    """Whether the run's model has random, untrained weights: its recorded weight kind, or
    ``--random-init`` in the config of runs written before the kind was recorded."""
    model, config = doc.get("model"), doc.get("config")
    if isinstance(model, dict) and model.get("weights") == "random":
        return True
    return isinstance(config, dict) and bool(config.get("random_init"))


def random_init_banner(name: str) -> str:
    """The banner of a report on a model with random weights (``--random-init``,
    ``pretrained=False``)."""
    return (
        f"**RANDOM WEIGHTS:** `{name}` has random, untrained weights (`--random-init` or "
        "`pretrained=False`); no trained weights were loaded. Artifacts found here, or their absence, say nothing about the trained model; "
        "use this report to check the tool, not to draw conclusions about the model."
    )


def synthetic_banner(doc: dict[str, Any], planted: str = "planted register neurons") -> str | None:
    """The banner of a report on a model that is not a trained ViT: a synthetic one (random
    weights with ``planted`` structure), or one built with ``--random-init``; ``None`` for
    trained weights."""
    model = doc["model"]
    name = model.get("spec") or model.get("class_name") or "model"
    if not is_synthetic(model):
        return random_init_banner(name) if is_random_init(doc) else None
    return (
        f"**SYNTHETIC MODEL:** `{name}` has random weights with {planted}; it is not a trained "
        "ViT. Use this report to check the tool, not to draw conclusions about real models."
    )


def model_section(doc: dict[str, Any]) -> Section:
    m = doc["model"]
    lay = m.get("layout", {})
    rows = [
        ["spec", code_span(m["spec"]) if m.get("spec") else "– (wrapped module)"],
        ["family / source", f"{text(m.get('family'))} / {text(m.get('source') or None)}"],
        ["weights", text(WEIGHT_KINDS.get(m.get("weights"), "not recorded"))],
        ["class", code(m.get("class_name"))],
        [
            "token layout",
            f"{lay.get('n_cls', 0)} [CLS], {lay.get('n_reg', 0)} registers, "
            f"{lay.get('n_patches', '?')} patches on a {lay.get('grid')} grid, "
            f"patch size {lay.get('patch_size')}",
        ],
        ["dimensions", ", ".join(f"{k} {num(v)}" for k, v in m.get("dims", {}).items())],
        ["image size", text(m.get("image_size"))],
        ["attention path", text(m.get("attention"))],
    ]
    s = Section("model", "Model", [Table(["", ""], rows)])
    s.blocks += [f"Note: {n}" for n in m.get("notes", [])]
    return s


def data_section(doc: dict[str, Any]) -> Section:
    d = doc["data"]
    s = Section("data", "Images")
    desc = f" (source: {d['description']})" if d.get("description") else ""
    s.blocks.append(f"{d['n_images']} images{desc} were analysed.")
    if d.get("synthetic"):
        s.blocks.append(
            "The images are synthetic (generated textures with flat regions), not photos."
        )
    if d["skipped"]:
        s.blocks.append(f"{len(d['skipped'])} files were skipped:")
        rows = [[code_span(k), escape_text(v)] for k, v in d["skipped"].items()]
        s.blocks.append(Table(["file", "reason"], rows))
    else:
        s.blocks.append("No file was skipped.")
    if d["converted"]:
        s.blocks.append(f"{len(d['converted'])} files were converted to 8-bit RGB:")
        s.blocks.append(
            Table(
                ["file", "original mode"],
                [[code_span(k), escape_text(v)] for k, v in d["converted"].items()],
            )
        )
    return s


def provenance_section(doc: dict[str, Any]) -> Section:
    keys = ("vitreg_version", "torch_version", "timm_version", "transformers_version")
    rows = [
        [k, text(doc.get(k)) if doc.get(k) is not None else "not installed"]
        for k in (*keys, "open_clip_version", "python_version")
    ]
    rows += [["created (UTC)", doc["created"]], ["command", code(doc["command"])]]
    rows += [[f"config: {k}", code(v)] for k, v in doc["config"].items()]
    return Section("provenance", "Provenance", [Table(["", ""], rows)])
