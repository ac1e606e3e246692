"""How LayerNorm separates [CLS] (and registers) from patches, block by block (ICLR 2026 analysis).

For each block, mean cosine similarity [CLS]-patch, patch-patch, register-patch and
register-[CLS] before and after ``norm1`` (``ln1.hook_in`` / ``ln1.hook_out``) and ``norm2``
(``hook_resid_mid`` / ``ln2.hook_out``), averaged over images (mean and std). Per channel,
ownership ``r[k] = log(m_cls[k] / m_patch[k])`` with ``m = E|x[k]|`` at the block input, the
fraction of owned channels (``|r| > log 4``), and how the ``norm1`` gain weights them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from vitreg.analysis.base import Analysis, Finished, Traced, run_analyses
from vitreg.core.layout import TokenLayout
from vitreg.errors import UnsupportedModelError
from vitreg.hooks.reducers import Mean, Reducer, as_tokens
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, TraceResult
from vitreg.progress import Update
from vitreg.results.diagnose import LNSeparation, Similarity

PAIRS = ("cls_patch", "patch_patch", "register_patch", "register_cls")
POINTS = {
    "pre_ln1": "ln1.hook_in",
    "post_ln1": "ln1.hook_out",
    "pre_ln2": "hook_resid_mid",
    "post_ln2": "ln2.hook_out",
}
OWNED = math.log(4.0)


def pair_similarities(x: torch.Tensor, layout: TokenLayout) -> dict[str, torch.Tensor]:
    """Per-image mean cosine similarities ``[B]`` for each pair type present in ``x [B, N, C]``.

    Patch-patch is the mean over ordered pairs i != j, computed exactly from the sum of unit
    vectors: ``(|sum p|^2 - N) / (N (N - 1))``.
    """
    unit = torch.nn.functional.normalize(x.float(), dim=-1)
    p = layout.take(unit, "patches")
    n = p.shape[1]
    p_sum = p.sum(1)
    out: dict[str, torch.Tensor] = {}
    if n > 1:
        out["patch_patch"] = ((p_sum * p_sum).sum(-1) - n) / (n * (n - 1))
    cls = layout.cls_token(unit) if layout.n_cls else None
    if cls is not None and n:
        out["cls_patch"] = (cls * p_sum).sum(-1) / n
    r = layout.take(unit, "registers")
    if r.shape[1] and n:
        out["register_patch"] = (r.sum(1) * p_sum).sum(-1) / (r.shape[1] * n)
    if r.shape[1] and cls is not None:
        out["register_cls"] = (r * cls[:, None]).sum(-1).mean(1)
    return out


class PairSimilarity(Reducer):
    """Streams :func:`pair_similarities`, keeping sums and sums of squares over images."""

    def __init__(self, site: str) -> None:
        super().__init__(site)
        self.sum: dict[str, float] = {}
        self.sumsq: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        x = as_tokens(t)
        sims = pair_similarities(x, ctx.layout)
        for k, v in sims.items():
            self.sum[k] = self.sum.get(k, 0.0) + float(v.double().sum())
            self.sumsq[k] = self.sumsq.get(k, 0.0) + float((v.double() ** 2).sum())
            self.count[k] = self.count.get(k, 0) + v.numel()

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, PairSimilarity)
        for k in other.sum:
            self.sum[k] = self.sum.get(k, 0.0) + other.sum[k]
            self.sumsq[k] = self.sumsq.get(k, 0.0) + other.sumsq[k]
            self.count[k] = self.count.get(k, 0) + other.count[k]
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> dict[str, Similarity]:
        out = {}
        for k, s in self.sum.items():
            n = self.count[k]
            mean = s / n
            std = math.sqrt(max(self.sumsq[k] / n - mean * mean, 0.0))
            out[k] = Similarity(mean=mean, std=std, n=n)
        return out


@dataclass
class LNResult(Traced):
    """Channel ownership ``r[k]`` at each block's input (None: no [CLS] or patch there), and
    the summary of the separation."""

    ownership: list[torch.Tensor | None]
    summary: LNSeparation


def ln_separation(
    model: Model,
    data: Any,
    batch_size: int = 32,
    limit: int | None = None,
    progress: Update | None = None,
) -> LNResult:
    """Measure [CLS]/register/patch similarity around each LayerNorm and channel ownership."""
    results, skipped, _ = run_analyses(model, data, [LNAnalysis()], batch_size, limit, progress)
    if "ln_separation" in skipped:
        raise UnsupportedModelError(skipped["ln_separation"])
    found = results["ln_separation"]
    assert isinstance(found, LNResult)
    return found


def _blocks(model: Model) -> list[str]:
    names = model.hook_names()
    return [n.removesuffix(".ln1.hook_in") for n in names if n.endswith(".ln1.hook_in")]


class LNAnalysis(Analysis):
    """Similarities around norm1/norm2 and channel ownership at every block's input."""

    name = "ln_separation"

    def not_applicable(self, model: Model) -> str | None:
        if model.layout.n_cls == 0 and model.layout.n_reg == 0:
            return "the model has no [CLS] or register token, so there is no [CLS]/patch separation to measure"
        if not _blocks(model):
            return (
                "the model exposes no ln1.hook_in sites (hierarchical models are not analysed here)"
            )
        return None

    def reducers(self, model: Model) -> list[Reducer]:
        sites = model.adapter.sites()
        out: list[Reducer] = []
        for b in _blocks(model):
            out += [PairSimilarity(f"{b}.{p}") for p in POINTS.values() if f"{b}.{p}" in sites]
            out.append(Mean(f"{b}.ln1.hook_in", of="abs"))
        return out

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> LNResult:
        by_site = {r.site: r.result() for r in trace.reducers if isinstance(r, PairSimilarity)}
        mags = {r.site: r.result() for r in trace.reducers if isinstance(r, Mean)}
        layout = model.layout
        similarity: list[dict[str, dict[str, Similarity]]] = []
        owned: list[float | None] = []
        gain: list[float | None] = []
        ownership: list[torch.Tensor | None] = []
        for b in _blocks(model):
            similarity.append({p: by_site.get(f"{b}.{s}", {}) for p, s in POINTS.items()})
            m = mags[f"{b}.ln1.hook_in"]
            if "cls" not in m or "patch" not in m:
                owned.append(None)
                gain.append(None)
                ownership.append(None)
                continue
            r = torch.log(m["cls"]["mean"].clamp_min(1e-12) / m["patch"]["mean"].clamp_min(1e-12))
            is_owned = r.abs() > OWNED
            owned.append(float(is_owned.float().mean()))
            gamma = _ln_gain(model, f"{b}.ln1.hook_out")
            if gamma is not None and is_owned.any() and (~is_owned).any():
                ratio = gamma[is_owned].abs().mean() / gamma[~is_owned].abs().mean().clamp_min(
                    1e-12
                )
                gain.append(float(ratio))
            else:
                gain.append(None)
            ownership.append(r)
        summary = LNSeparation(
            similarity=similarity,
            owned_channel_fraction=owned,
            ln1_gain_owned_over_other=gain,
            owned_threshold="|log(m_cls/m_patch)| > log 4",
            has_cls=layout.n_cls > 0,
            has_registers=layout.n_reg > 0,
        )
        return LNResult(ownership, summary)


def _ln_gain(model: Model, site: str) -> torch.Tensor | None:
    """The affine gain of the LayerNorm behind ``site`` (None if it has none)."""
    module = getattr(model.site(site), "module", None)
    weight = getattr(module, "weight", None)
    return weight.detach().float().cpu() if isinstance(weight, torch.Tensor) else None
