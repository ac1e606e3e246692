"""Streaming reducers: statistics of one hook site accumulated over batches in bounded memory.

Each reducer keeps sums, counts, maxima or fixed-bin histograms, so two reducers fed with
disjoint data can be merged (``merge``) into the answer for the union -- the property that lets
a ``torchrun`` job give the same result as one process. Norms are always taken in float32.
Tensors are flattened to ``[B, N, C]`` (grids ``[B, h, w, C]`` become row-major token lists);
per-token-type statistics use the site's :class:`TokenLayout`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypedDict, TypeVar

import torch

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.hooks.sites import HookContext

#: what a reducer's :meth:`Reducer.result` returns
R = TypeVar("R")

TOKEN_TYPES = ("cls", "register", "extra", "patch")


def as_tokens(t: torch.Tensor) -> torch.Tensor:
    """``[B, N, C]`` view of a token tensor; ``[B, h, w, C]`` grids are flattened row-major."""
    if t.dim() == 3:
        return t
    if t.dim() == 4:
        return t.flatten(1, 2)
    raise ValueError(
        f"expected a token tensor [B, N, C] or grid [B, h, w, C], got {tuple(t.shape)}"
    )


def token_norms(t: torch.Tensor) -> torch.Tensor:
    """Per-token L2 norms ``[B, N]`` in float32 (half-precision activations overflow otherwise)."""
    return as_tokens(t).float().norm(dim=-1)


def type_index(ctx: HookContext, n_tokens: int) -> dict[str, slice]:
    """Slices of each token type present at this site (everything is 'patch' without a layout)."""
    layout = ctx.layout
    if layout is None or layout.n_tokens != n_tokens:
        return {"patch": slice(0, n_tokens)}
    parts = {
        "cls": layout.cls,
        "register": layout.registers,
        "extra": layout.extra,
        "patch": layout.patches,
    }
    return {k: v for k, v in parts.items() if v.stop > v.start}


class Reducer(ABC, Generic[R]):
    """Accumulates one statistic of the hook site ``site`` (a statistic that combines several
    sites of one forward pass lists them all in :attr:`sites`; ``update`` tells them apart by
    ``ctx.name``); :meth:`result` returns its statistics as an ``R``.

    A reducer with ``streams_patterns`` reads an ``attn.hook_pattern`` it is fed either as the
    full tensor or as a :class:`~vitreg.hooks.streamed.StreamedPattern` (q and k, rows rebuilt
    in query chunks), through :mod:`vitreg.hooks.streamed`'s functions; one with
    ``reads_pattern_columns`` also reads its column statistics (column sums, key columns), which
    a traced forward then computes with the attention itself."""

    streams_patterns = False
    reads_pattern_columns = False

    def __init__(self, site: str) -> None:
        self.site = site
        self.n_images = 0

    @property
    def sites(self) -> tuple[str, ...]:
        """Every site this reducer is fed from."""
        return (self.site,)

    def __call__(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        self.update(t.detach(), ctx, image_offset)
        self.n_images = max(self.n_images, image_offset + t.shape[0])

    @abstractmethod
    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None: ...

    @abstractmethod
    def merge(self, other: Reducer) -> None:
        """Fold in a reducer of the same kind fed with other images (offsets already disjoint)."""

    @abstractmethod
    def result(self) -> R: ...


class TokenNormsResult(TypedDict):
    """Norms ``[n_images, N]`` of the images kept, their global indices and the site's layout."""

    norms: torch.Tensor
    image_index: torch.Tensor
    layout: TokenLayout | None


class TokenNorms(Reducer[TokenNormsResult]):
    """Per-image, per-token L2 norms ``[n_images, N]`` (float32, on CPU).

    Memory is ``4 * N`` bytes per image, independent of the width: 200 images of ViT-S/14 at
    224 px take 200 KB. ``max_images`` keeps only the first maps when even that is too much.
    Rows go into one buffer that doubles when full: many small tensors kept per batch between
    the forward pass's large temporaries fragment glibc's heap, and RSS then grows by about the
    size of the activations every batch (see benchmarks/trace_memory.py).
    """

    def __init__(self, site: str, max_images: int | None = None) -> None:
        super().__init__(site)
        self.max_images = max_images
        self._norms = torch.empty(0, 0)
        self._filled = torch.empty(0, dtype=torch.bool)
        self.layout: TokenLayout | None = None

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        self.layout = ctx.layout
        norms = token_norms(t).cpu()
        if self.max_images is not None:
            norms = norms[: max(0, self.max_images - image_offset)]
        self._put(torch.arange(image_offset, image_offset + norms.shape[0]), norms)

    def _put(self, index: torch.Tensor, rows: torch.Tensor) -> None:
        if not len(index):
            return
        if self._filled.any() and rows.shape[1] != self._norms.shape[1]:
            raise InputError(
                f"TokenNorms({self.site!r}) got {rows.shape[1]} tokens per image after "
                f"{self._norms.shape[1]}; trace images of one size per reducer"
            )
        size = int(index.max()) + 1
        if size > len(self._norms) or rows.shape[1] != self._norms.shape[1]:
            capacity = max(size, 2 * len(self._norms), 64)
            norms = torch.zeros(capacity, rows.shape[1])
            filled = torch.zeros(capacity, dtype=torch.bool)
            if self._filled.any():
                norms[: len(self._norms)] = self._norms
                filled[: len(self._filled)] = self._filled
            self._norms, self._filled = norms, filled
        self._norms[index] = rows
        self._filled[index] = True

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, TokenNorms)
        index = other._filled.nonzero().squeeze(1)
        self._put(index, other._norms[index])
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> TokenNormsResult:
        index = self._filled.nonzero().squeeze(1)
        norms = self._norms[index] if len(index) else torch.empty(0)
        return {"norms": norms, "image_index": index, "layout": self.layout}


class MeanStats(TypedDict):
    """Mean and standard deviation of one token type (``[C]``, or scalars for norms), over
    ``count`` tokens."""

    mean: torch.Tensor
    std: torch.Tensor
    count: int


class Mean(Reducer[dict[str, MeanStats]]):
    """Running mean and standard deviation of a site, per token type.

    ``of='value'`` averages the activation vectors (result per type: ``[C]``); ``of='abs'``
    their absolute values (per-channel magnitudes); ``of='norm'`` per-token norms (a scalar).
    """

    def __init__(self, site: str, of: str = "value") -> None:
        super().__init__(site)
        if of not in ("value", "abs", "norm"):
            raise ValueError("of must be 'value', 'abs' or 'norm'")
        self.of = of
        self.sum: dict[str, torch.Tensor] = {}
        self.sumsq: dict[str, torch.Tensor] = {}
        self.count: dict[str, int] = {}

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        x = as_tokens(t).float()
        if self.of == "norm":
            x = x.norm(dim=-1, keepdim=True)
        elif self.of == "abs":
            x = x.abs()
        for kind, sl in type_index(ctx, x.shape[1]).items():
            part = x[:, sl].reshape(-1, x.shape[-1]).double()
            self._add(kind, part.sum(0), (part * part).sum(0), part.shape[0])

    def _add(self, kind: str, s: torch.Tensor, sq: torch.Tensor, n: int) -> None:
        if kind in self.sum:
            self.sum[kind] = self.sum[kind] + s.cpu()
            self.sumsq[kind] = self.sumsq[kind] + sq.cpu()
            self.count[kind] += n
        else:
            self.sum[kind], self.sumsq[kind], self.count[kind] = s.cpu(), sq.cpu(), n

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, Mean)
        for kind in other.sum:
            self._add(kind, other.sum[kind], other.sumsq[kind], other.count[kind])
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> dict[str, MeanStats]:
        out: dict[str, MeanStats] = {}
        for kind, s in self.sum.items():
            n = self.count[kind]
            mean = s / n
            var = (self.sumsq[kind] / n - mean * mean).clamp_min(0)
            squeeze = self.of == "norm"
            out[kind] = {
                "mean": (mean.squeeze(-1) if squeeze else mean).float(),
                "std": (var.sqrt().squeeze(-1) if squeeze else var.sqrt()).float(),
                "count": n,
            }
        return out


class MaxResult(TypedDict):
    """The maxima and the (global image, token) where each occurred; ``None`` before any data."""

    value: torch.Tensor | None
    image: torch.Tensor | None
    token: torch.Tensor | None


class Max(Reducer[MaxResult]):
    """Per-channel maximum over all tokens and images, with where it occurred.

    Result: ``value [C]``, ``image [C]`` (global image index) and ``token [C]``; with
    ``of='norm'``, the single largest token norm and its position.
    """

    def __init__(self, site: str, of: str = "value") -> None:
        super().__init__(site)
        if of not in ("value", "norm"):
            raise ValueError("of must be 'value' or 'norm'")
        self.of = of
        self.value: torch.Tensor | None = None
        self.image: torch.Tensor | None = None
        self.token: torch.Tensor | None = None

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        x = as_tokens(t).float()
        if self.of == "norm":
            x = x.norm(dim=-1, keepdim=True)
        b, n, c = x.shape
        value, flat = x.reshape(b * n, c).max(dim=0)
        image = flat // n + image_offset
        token = flat % n
        self._fold(value.cpu(), image.cpu(), token.cpu())

    def _fold(self, value: torch.Tensor, image: torch.Tensor, token: torch.Tensor) -> None:
        if self.value is None:
            self.value, self.image, self.token = value, image, token
            return
        better = value > self.value
        self.value = torch.where(better, value, self.value)
        self.image = torch.where(better, image, self.image)
        self.token = torch.where(better, token, self.token)

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, Max)
        if other.value is not None:
            self._fold(other.value, other.image, other.token)
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> MaxResult:
        squeeze = self.of == "norm"

        def fix(t: torch.Tensor | None) -> torch.Tensor | None:
            return t.squeeze(-1) if (t is not None and squeeze) else t

        return {"value": fix(self.value), "image": fix(self.image), "token": fix(self.token)}


class HistogramResult(TypedDict):
    """Bin edges (log10 of the norm when ``log10``) and the counts per token type."""

    edges: torch.Tensor
    log10: bool
    counts: dict[str, torch.Tensor]


class Histogram(Reducer[HistogramResult]):
    """Fixed-bin histogram of per-token norms, per token type.

    Bins are fixed up front (``lo``..``hi``, on a log10 scale when ``log``) so histograms from
    different processes add up exactly; values outside the range land in the edge bins.
    """

    def __init__(
        self, site: str, bins: int = 100, lo: float = -2.0, hi: float = 4.0, log: bool = True
    ) -> None:
        super().__init__(site)
        self.bins, self.lo, self.hi, self.log = bins, lo, hi, log
        self.counts: dict[str, torch.Tensor] = {}

    def edges(self) -> torch.Tensor:
        return torch.linspace(self.lo, self.hi, self.bins + 1)

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        norms = token_norms(t)
        if self.log:
            norms = norms.clamp_min(1e-12).log10()
        for kind, sl in type_index(ctx, norms.shape[1]).items():
            v = norms[:, sl].reshape(-1).clamp(self.lo, self.hi).cpu()
            h = torch.histc(v, bins=self.bins, min=self.lo, max=self.hi).long()
            self.counts[kind] = self.counts.get(kind, torch.zeros(self.bins, dtype=torch.long)) + h

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, Histogram)
        for kind, h in other.counts.items():
            self.counts[kind] = self.counts.get(kind, torch.zeros_like(h)) + h
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> HistogramResult:
        return {"edges": self.edges(), "log10": self.log, "counts": dict(self.counts)}


class TopKResult(TypedDict):
    """The largest norms, largest first, with their global image and token positions."""

    values: torch.Tensor
    image: torch.Tensor
    token: torch.Tensor


class TopK(Reducer[TopKResult]):
    """The ``k`` largest token norms seen, with (image, token) positions."""

    def __init__(self, site: str, k: int = 16) -> None:
        super().__init__(site)
        self.k = k
        self.values = torch.empty(0)
        self.image = torch.empty(0, dtype=torch.long)
        self.token = torch.empty(0, dtype=torch.long)

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        norms = token_norms(t).cpu()
        b, n = norms.shape
        pos = torch.arange(b * n)
        self._fold(norms.reshape(-1), pos // n + image_offset, pos % n)

    def _fold(self, values: torch.Tensor, image: torch.Tensor, token: torch.Tensor) -> None:
        values = torch.cat([self.values, values])
        image = torch.cat([self.image, image])
        token = torch.cat([self.token, token])
        top = values.topk(min(self.k, values.numel())).indices
        self.values, self.image, self.token = values[top], image[top], token[top]

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, TopK)
        self._fold(other.values, other.image, other.token)
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> TopKResult:
        return {"values": self.values, "image": self.image, "token": self.token}
