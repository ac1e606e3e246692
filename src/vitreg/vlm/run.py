"""One VLM comparison: per image, the answer and the language->image attention maps without and
with a fix on the vision tower, and how much the answer changed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vitreg.analysis.rules import Z_CUT, robust_mask
from vitreg.fix.base import Fix, fix_description
from vitreg.models.loaders.hf_vlm import vlm_of
from vitreg.models.model import Model, iter_batches
from vitreg.progress import Update
from vitreg.results.schema import plain
from vitreg.results.vlm import Condition as ConditionResults
from vitreg.results.vlm import (
    FirstToken,
    Generation,
    OutlierAttention,
    TaxonomySides,
    VlmImage,
    VlmResults,
    VlmSummary,
    VlmTaxonomy,
)
from vitreg.vlm import taxonomy
from vitreg.vlm.attention import Reading, read, to_grid
from vitreg.vlm.change import answer_change, first_token_change
from vitreg.vlm.inputs import prompt_text, query_positions, token_ids

#: why generation never emits the image token (in every vlm results block)
SUPPRESSED = (
    "the image token is suppressed during generation: fed back with the answer, a generated "
    "image token would be read as an image placeholder without image features"
)


@dataclass
class Condition:
    """One image under one condition: ``results``, its typed summary (the answer and the
    numbers metrics.json holds), and the forward pass and maps the figures read."""

    results: ConditionResults
    reading: Reading
    attention_grid: torch.Tensor  # [h, w], mean over layers, heads and rows
    layer_grids: torch.Tensor  # [L, h, w], mean over heads and rows


def condition_results(
    answer_ids: list[int], answer: str, reading: Reading, grid: torch.Tensor, tokenizer: Any
) -> ConditionResults:
    """The typed summary of one condition: the answer, the image attention mass per layer, the
    maps and the tower's norms, and the most likely first answer token."""
    mass = reading.attention.mass.mean(dim=(1, 2))  # per layer
    norms = reading.norm_grid
    top = int(reading.logits[0].argmax())
    extra = reading.extra_norms
    return ConditionResults(
        answer=answer,
        answer_tokens=answer_ids,
        n_generated=len(answer_ids),
        positions=reading.attention.positions,
        image_attention_mass=mass.tolist(),
        image_attention_mass_mean=float(mass.mean()),
        attention_map=grid.tolist(),
        norm_map=norms.tolist(),
        max_patch_norm=float(norms.max()),
        max_over_median=float(norms.max() / norms.median()),
        register_norm=float(extra.max()) if extra.numel() else None,
        first_token=FirstToken(
            id=top,
            token=tokenizer.convert_ids_to_tokens(top),
            prob=float(torch.softmax(reading.logits[0], -1)[top]),
        ),
    )


def condition(
    model: Model,
    ids: torch.Tensor,
    pixel_values: torch.Tensor,
    query: str | Sequence[int] = "answer",
    max_new_tokens: int = 32,
    sites: Sequence[int] = (0,),
    k: int = taxonomy.DEFAULT_K,
) -> Condition:
    """Generate greedily from ``ids`` and one image, then read the attention of the ``query`` rows
    over the image tokens, and the image tokens' ``k`` nearest vocabulary ids at the
    language-model ``sites``, in a forward pass over prompt + answer (fixes active stay active).

    The image token is never generated (suppressed, :data:`SUPPRESSED`): fed back with the
    answer it would be taken for an image placeholder that has no image features (an untrained
    language model picks it as readily as any word)."""
    vlm = vlm_of(model)
    ids = ids.to(model.device)
    pv = pixel_values.to(device=model.device, dtype=model.dtype)
    with torch.no_grad():
        out = vlm.module.generate(
            input_ids=ids,
            pixel_values=pv,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            suppress_tokens=[vlm.image_token_id],
        )
    generated = out[0, ids.shape[1] :].cpu()
    seq = torch.cat([ids[0].cpu(), generated])[None]
    n_prompt = ids.shape[1]
    positions = query_positions(query, n_prompt, len(generated), seq.shape[1])
    reading = read(model, seq, pv, positions, [n_prompt - 1], sites, k)
    size = (int(pv.shape[-2]), int(pv.shape[-1]))
    layers = reading.attention.layer_maps()
    grids = torch.stack([to_grid(model, m, size) for m in layers])
    text = vlm.tokenizer.decode(generated, skip_special_tokens=True)
    grid = grids.mean(0)
    summary = condition_results(generated.tolist(), text, reading, grid, vlm.tokenizer)
    return Condition(summary, reading, grid, grids)


def outlier_mask(before: Condition) -> torch.Tensor:
    """``[h, w]`` patches whose feature-layer norm is an outlier before the fix (robust z)."""
    norms = before.reading.norm_grid
    return robust_mask(norms.flatten()[None])[0].reshape(norms.shape)


@dataclass
class ImageResult:
    """One image: without (``before``) and with (``after``) the fix, and ``results``, the
    typed summary of both and of what changed."""

    before: Condition
    after: Condition
    results: VlmImage

    @classmethod
    def compare(cls, before: Condition, after: Condition) -> ImageResult:
        """The two conditions of one image and what changed between them."""
        mask = outlier_mask(before)

        def share(c: Condition) -> float | None:
            total = float(c.attention_grid.sum())
            return float(c.attention_grid[mask].sum()) / total if mask.any() and total else None

        results = VlmImage(
            before=before.results,
            after=after.results,
            answer_change=answer_change(before.results.answer_tokens, after.results.answer_tokens),
            first_token=first_token_change(before.reading.logits[0], after.reading.logits[0]),
            attention_on_outliers=OutlierAttention(
                n_outlier_patches=int(mask.sum()),
                rule=f"robust z > {Z_CUT} on log patch norms (before the fix)",
                before=share(before),
                after=share(after),
            ),
        )
        return cls(before, after, results)


@dataclass
class VlmResult:
    """Every image's comparison: ``results``, the typed results block, and each image's
    conditions with the maps the figures read."""

    results: VlmResults
    images: list[ImageResult] = field(default_factory=list)


def _mean(values: Iterable[float | bool | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def summary(rows: list[VlmImage]) -> VlmSummary:
    """Means over images of the per-image numbers (``None`` where no image has the number)."""
    return VlmSummary(
        n_images=len(rows),
        identical_rate=_mean(r.answer_change.identical for r in rows),
        edit_distance_normalized=_mean(r.answer_change.edit_distance_normalized for r in rows),
        first_token_kl=_mean(r.first_token.kl for r in rows),
        same_first_token_rate=_mean(r.first_token.same_top_token for r in rows),
        attention_on_outliers_before=_mean(r.attention_on_outliers.before for r in rows),
        attention_on_outliers_after=_mean(r.attention_on_outliers.after for r in rows),
        max_over_median_before=_mean(r.before.max_over_median for r in rows),
        max_over_median_after=_mean(r.after.max_over_median for r in rows),
        image_attention_mass_before=_mean(r.before.image_attention_mass_mean for r in rows),
        image_attention_mass_after=_mean(r.after.image_attention_mass_mean for r in rows),
    )


def token_taxonomy(
    model: Model,
    compared: list[ImageResult],
    k: int,
    sink_tokens: Sequence[int] | None,
    dead_tokens: Sequence[int] | None,
) -> VlmTaxonomy:
    """The sink / dead / alive split over all images (anchors from the bare input tokens
    when not given), each image's own split attached to its ``results``."""
    vlm = vlm_of(model)
    inputs = [c.before.reading.sites[0] for c in compared]
    anchors = taxonomy.find_anchors(vlm, inputs, sink_tokens, dead_tokens)
    sides = []
    for c in compared:
        side = TaxonomySides(
            before=taxonomy.splits(c.before.reading.sites, anchors),
            after=taxonomy.splits(c.after.reading.sites, anchors),
        )
        c.results = c.results.model_copy(update={"taxonomy": side})
        sides.append(side)
    return VlmTaxonomy(
        rule=taxonomy.RULE,
        k=k,
        anchors=anchors,
        before=taxonomy.total([s.before for s in sides]),
        after=taxonomy.total([s.after for s in sides]),
    )


def run_vlm(
    model: Model,
    images: Any,
    prompt: str,
    fix: Fix,
    max_new_tokens: int = 32,
    query: str | Sequence[int] = "answer",
    batch_size: int = 8,
    progress: Update | None = None,
    llm_layers: Sequence[int] | None = None,
    taxonomy_k: int = taxonomy.DEFAULT_K,
    sink_tokens: Sequence[int] | None = None,
    dead_tokens: Sequence[int] | None = None,
) -> VlmResult:
    """For each image (tensor batches, a DataLoader or an image source in the tower's input
    space): answer ``prompt`` and read the attention maps without, then with ``fix`` applied
    to the tower; and the sink / dead / alive split of the image tokens at the language
    model's input and at ``llm_layers`` (:mod:`vitreg.vlm.taxonomy`). One image per forward
    pass, the VLM on the tower's device; ``progress(n)`` after each image."""
    from vitreg.vlm.attention import feature_site

    vlm = vlm_of(model)
    sites = taxonomy.check_sites(vlm, llm_layers)
    k = taxonomy.check_k(vlm, taxonomy_k)
    vlm.module.to(device=model.device)  # the tower may have been moved alone (Model.to)
    text = prompt_text(vlm, prompt)
    compared: list[ImageResult] = []
    for batch in iter_batches(images, batch_size):
        for x in batch:
            pv = x[None]
            ids = token_ids(model, vlm, text, (int(pv.shape[-2]), int(pv.shape[-1])))
            before = condition(model, ids, pv, query, max_new_tokens, sites, k)
            with fix.applied(model):
                after = condition(model, ids, pv, query, max_new_tokens, sites, k)
            compared.append(ImageResult.compare(before, after))
            if progress is not None:
                progress(len(compared))
    split = token_taxonomy(model, compared, k, sink_tokens, dead_tokens) if compared else None
    rows = [r.results for r in compared]
    token = vlm.tokenizer.convert_ids_to_tokens(vlm.image_token_id)
    results = VlmResults(
        prompt=prompt,
        prompt_text=text,
        query=query if isinstance(query, str) else list(query),
        feature_site=feature_site(model, vlm),
        fix=plain(fix_description(fix)),
        generation=Generation(
            greedy=True, suppressed_tokens={token: vlm.image_token_id}, why=SUPPRESSED
        ),
        summary=summary(rows),
        images=rows,
        taxonomy=split,
    )
    return VlmResult(results, compared)
