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
    """One image under one condition: the answer and what the forward pass over it showed."""

    answer_ids: list[int]
    answer: str
    reading: Reading
    attention_grid: torch.Tensor  # [h, w], mean over layers, heads and rows
    layer_grids: torch.Tensor  # [L, h, w], mean over heads and rows

    def to_dict(self, tokenizer: Any) -> dict[str, Any]:
        att = self.reading.attention
        mass = att.mass.mean(dim=(1, 2))  # per layer
        norms = self.reading.norm_grid
        top = int(self.reading.logits[0].argmax())
        extra = self.reading.extra_norms
        return {
            "answer": self.answer,
            "answer_tokens": self.answer_ids,
            "n_generated": len(self.answer_ids),
            "positions": att.positions,
            "image_attention_mass": mass.tolist(),
            "image_attention_mass_mean": float(mass.mean()),
            "attention_map": self.attention_grid.tolist(),
            "norm_map": norms.tolist(),
            "max_patch_norm": float(norms.max()),
            "max_over_median": float(norms.max() / norms.median()),
            "register_norm": float(extra.max()) if extra.numel() else None,
            "first_token": {
                "id": top,
                "token": tokenizer.convert_ids_to_tokens(top),
                "prob": float(torch.softmax(self.reading.logits[0], -1)[top]),
            },
        }


def condition(
    model: Model,
    ids: torch.Tensor,
    pixel_values: torch.Tensor,
    query: str | Sequence[int] = "answer",
    max_new_tokens: int = 32,
) -> Condition:
    """Generate greedily from ``ids`` and one image, then read the attention of the ``query`` rows
    over the image tokens in a forward pass over prompt + answer (fixes active stay active).

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
    reading = read(model, seq, pv, positions, [n_prompt - 1])
    size = (int(pv.shape[-2]), int(pv.shape[-1]))
    layers = reading.attention.layer_maps()
    grids = torch.stack([to_grid(model, m, size) for m in layers])
    text = vlm.tokenizer.decode(generated, skip_special_tokens=True)
    return Condition(generated.tolist(), text, reading, grids.mean(0), grids)


@dataclass
class ImageResult:
    """One image: without (``before``) and with (``after``) the fix, and the change."""

    before: Condition
    after: Condition

    def outlier_mask(self) -> torch.Tensor:
        """``[h, w]`` patches whose feature-layer norm is an outlier before the fix (robust z)."""
        norms = self.before.reading.norm_grid
        return robust_mask(norms.flatten()[None])[0].reshape(norms.shape)

    def to_dict(self, tokenizer: Any) -> dict[str, Any]:
        mask = self.outlier_mask()

        def share(c: Condition) -> float | None:
            total = float(c.attention_grid.sum())
            return float(c.attention_grid[mask].sum()) / total if mask.any() and total else None

        return {
            "before": self.before.to_dict(tokenizer),
            "after": self.after.to_dict(tokenizer),
            "answer_change": answer_change(self.before.answer_ids, self.after.answer_ids),
            "first_token": first_token_change(
                self.before.reading.logits[0], self.after.reading.logits[0]
            ),
            "attention_on_outliers": {
                "n_outlier_patches": int(mask.sum()),
                "rule": f"robust z > {Z_CUT} on log patch norms (before the fix)",
                "before": share(self.before),
                "after": share(self.after),
            },
        }


@dataclass
class VlmResult:
    """Every image's comparison plus the settings; ``to_dict`` is the results block."""

    prompt: str
    text: str
    query: str | list[int]
    feature_site: str
    fix: dict[str, Any]
    images: list[ImageResult] = field(default_factory=list)
    tokenizer: Any = None
    image_token_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        rows = [r.to_dict(self.tokenizer) for r in self.images]
        return {
            "prompt": self.prompt,
            "prompt_text": self.text,
            "query": self.query,
            "feature_site": self.feature_site,
            "fix": self.fix,
            "generation": {
                "greedy": True,
                "suppressed_tokens": {
                    self.tokenizer.convert_ids_to_tokens(self.image_token_id): self.image_token_id
                },
                "why": SUPPRESSED,
            },
            "summary": summary(rows),
            "images": rows,
        }


def _mean(values: Iterable[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over images of the per-image numbers (``None`` where no image has the number)."""
    return {
        "n_images": len(rows),
        "identical_rate": _mean(r["answer_change"]["identical"] for r in rows),
        "edit_distance_normalized": _mean(
            r["answer_change"]["edit_distance_normalized"] for r in rows
        ),
        "first_token_kl": _mean(r["first_token"]["kl"] for r in rows),
        "same_first_token_rate": _mean(r["first_token"]["same_top_token"] for r in rows),
        "attention_on_outliers_before": _mean(r["attention_on_outliers"]["before"] for r in rows),
        "attention_on_outliers_after": _mean(r["attention_on_outliers"]["after"] for r in rows),
        "max_over_median_before": _mean(r["before"]["max_over_median"] for r in rows),
        "max_over_median_after": _mean(r["after"]["max_over_median"] for r in rows),
        "image_attention_mass_before": _mean(
            r["before"]["image_attention_mass_mean"] for r in rows
        ),
        "image_attention_mass_after": _mean(r["after"]["image_attention_mass_mean"] for r in rows),
    }


def run_vlm(
    model: Model,
    images: Any,
    prompt: str,
    fix: Fix,
    max_new_tokens: int = 32,
    query: str | Sequence[int] = "answer",
    batch_size: int = 8,
    progress: Update | None = None,
) -> VlmResult:
    """For each image (tensor batches, a DataLoader or an image source in the tower's input
    space): answer ``prompt`` and read the attention maps without, then with ``fix`` applied
    to the tower. One image per forward pass, the VLM on the tower's device; ``progress(n)``
    after each image."""
    from vitreg.vlm.attention import feature_site

    vlm = vlm_of(model)
    vlm.module.to(device=model.device)  # the tower may have been moved alone (Model.to)
    text = prompt_text(vlm, prompt)
    result = VlmResult(
        prompt,
        text,
        query if isinstance(query, str) else list(query),
        feature_site(model, vlm),
        fix_description(fix),
        tokenizer=vlm.tokenizer,
        image_token_id=vlm.image_token_id,
    )
    done = 0
    for batch in iter_batches(images, batch_size):
        for x in batch:
            pv = x[None]
            ids = token_ids(model, vlm, text, (int(pv.shape[-2]), int(pv.shape[-1])))
            before = condition(model, ids, pv, query, max_new_tokens)
            with fix.applied(model):
                after = condition(model, ids, pv, query, max_new_tokens)
            result.images.append(ImageResult(before, after))
            done += 1
            if progress is not None:
                progress(done)
    return result
