"""Attention probabilities kept as q and k: the statistics analyses need, in query chunks.

A recomputed ``hook_pattern`` arrives as a :class:`StreamedPattern` at hooks that accept one
(:func:`accepts_streamed`; the trace marks a site's hook so when every reducer there does), and
as the full ``[B, H, N, N]`` tensor everywhere else. Rows are rebuilt ``chunk`` queries at a
time, so one block never holds more than ``[B, H, chunk, N]``; the functions below
(:func:`column_mean`, :func:`query_rows`, :func:`key_column`, :func:`head_gram`) take either
form, so both paths share one computation and agree to float rounding.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from vitreg.hooks.softmax import mask_bias, softmax_pattern

# queries per chunk, in head dimensions: a chunk's scores [B, H, chunk, N] are then at most
# 1.25x the block's MLP activations [B, N, 4 * H * head_dim]
DEFAULT_CHUNK_HEAD_DIMS = 5
_CHUNK: ContextVar[int | None] = ContextVar("pattern_chunk", default=None)
_ENABLED: ContextVar[bool] = ContextVar("streamed_patterns", default=True)
_ONCE: ContextVar[bool] = ContextVar("attention_once", default=True)
_ACCEPTS = "accepts_streamed_patterns"
CPU_CHUNK_BYTES = 4 * 2**20  # on a CPU a tile's scores stay within this (cache-sized: the
# passes over them after the product then read the cache, not memory)
CPU_TILE_ROWS = 128  # but a tile holds this many queries at least (shorter products run slower)
SCRATCH_BYTES = CPU_CHUNK_BYTES  # the largest tile buffer kept for reuse (per thread)
LN2 = math.log(2.0)
LOG2E = 1.0 / LN2  # chunk scores are kept in base 2: exp2 is several times faster than
# exp on a CPU, and the probabilities are the same to float rounding
_SCRATCH = threading.local()
_COLUMNS = "reads_pattern_columns"
Tile = tuple[slice, slice, slice]  # images, heads, queries


def split(n: int, most: int) -> list[slice]:
    """``range(n)`` in slices of near-equal size, none longer than ``most`` (at least 1)."""
    parts = math.ceil(n / max(1, min(most, n)))
    size = math.ceil(n / parts)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@contextmanager
def streamed_patterns(enabled: bool) -> Iterator[None]:
    """Within this block recomputed patterns reach every hook in full when ``enabled`` is False
    (the reference path streamed statistics are checked against)."""
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


@contextmanager
def pattern_chunk(queries: int | None) -> Iterator[None]:
    """Within this block streamed patterns are rebuilt ``queries`` rows at a time (None: the
    default, :data:`DEFAULT_CHUNK_HEAD_DIMS` times the head dimension)."""
    if queries is not None and queries < 1:
        raise ValueError(f"a pattern chunk holds at least one query, got {queries}")
    token = _CHUNK.set(queries)
    try:
        yield
    finally:
        _CHUNK.reset(token)


def mark_streamed(fn: Callable, accepts: bool, columns: bool = False) -> Callable:
    """Mark a hook function as taking :class:`StreamedPattern` values (or not), and as reading
    their column statistics (``columns``: column sums or single key columns); returns ``fn``."""
    setattr(fn, _ACCEPTS, accepts)
    setattr(fn, _COLUMNS, accepts and columns)
    return fn


def same_marks(fn: Callable, like: Callable) -> Callable:
    """Mark ``fn`` as ``like`` is marked (:func:`mark_streamed`); returns ``fn``."""
    return mark_streamed(fn, getattr(like, _ACCEPTS, False), getattr(like, _COLUMNS, False))


def reads_columns(fn: Callable) -> bool:
    """Whether ``fn`` was marked as reading the column statistics of streamed patterns, so that
    the attention is worth computing once with them (:meth:`StreamedPattern.attend`; also when
    :func:`streamed_patterns` is off, so both paths see one forward) unless
    :func:`attention_once` switched that off."""
    return bool(getattr(fn, _COLUMNS, False)) and _ONCE.get()


@contextmanager
def attention_once(enabled: bool) -> Iterator[None]:
    """Within this block a traced forward computes attention once with its statistics where
    they are read (``enabled``, the default) or leaves the model's own SDPA call alone and
    recomputes the statistics from q and k (the forward then equals the bare one bit for bit)."""
    token = _ONCE.set(enabled)
    try:
        yield
    finally:
        _ONCE.reset(token)


def accepts_streamed(fn: Callable) -> bool:
    """Whether ``fn`` gets :class:`StreamedPattern` values: it was marked as taking them and
    streaming is not switched off (:func:`streamed_patterns`)."""
    return bool(getattr(fn, _ACCEPTS, False)) and _ENABLED.get()


def scratch(numel: int, like: torch.Tensor, keep: bool = True) -> torch.Tensor:
    """A flat float32 buffer of ``numel`` elements on ``like``'s device. On a CPU one buffer of
    up to :data:`SCRATCH_BYTES` is kept per thread and reused by every chunked pass that may
    ``keep`` it (a fresh large tensor faults its pages in again for every block); only one pass
    uses it at a time. The kept buffer is a normal tensor (not an inference one), so passes in
    and out of ``torch.inference_mode`` share it."""
    if like.device.type != "cpu" or numel * 4 > SCRATCH_BYTES or not keep:
        return like.new_empty(numel, dtype=torch.float32)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):
            buf = like.new_empty(numel, dtype=torch.float32)
        _SCRATCH.buf = buf
    return buf[:numel]


@dataclass
class _Sums:
    """What one pass over the query chunks fills: column sums ``[B, H, N_k]``, row maxima and
    row sums of ``e`` (base 2, for the log-sum-exp), per-row values ``[B, H, N]``, and the
    attention output when values ``v`` are given."""

    col: torch.Tensor
    top: torch.Tensor
    total: torch.Tensor
    row_fns: dict[str, Callable[[torch.Tensor], torch.Tensor]]
    per_row: dict[str, torch.Tensor]
    v: torch.Tensor | None = None
    out: torch.Tensor | None = None


@dataclass
class StreamedPattern:
    """``softmax(q*scale @ k^T + mask)`` of one batch, held as ``q, k [B, H, N, D]``.

    Statistics are computed in float32 from rows rebuilt in query chunks; the row log-sum-exp
    of the first pass is kept so that single columns and selected heads are rebuilt exactly.
    """

    q: torch.Tensor
    k: torch.Tensor
    scale: float
    attn_mask: torch.Tensor | None = None
    is_causal: bool = False
    chunk: int | None = None
    _memo: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.chunk is None:
            self.chunk = _CHUNK.get() or DEFAULT_CHUNK_HEAD_DIMS * self.q.shape[-1]

    @property
    def shape(self) -> torch.Size:
        b, h, n, _ = self.q.shape
        return torch.Size((b, h, n, self.k.shape[-2]))

    def detach(self) -> StreamedPattern:
        return self

    def full(self) -> torch.Tensor:
        """The whole probability tensor, exactly as :func:`~vitreg.hooks.softmax.softmax_pattern`."""
        return softmax_pattern(self.q, self.k, self.scale, self.attn_mask, self.is_causal)

    # rows -----------------------------------------------------------------------------
    def slices(self, rows: int | None = None) -> list[slice]:
        """Query slices of near-equal size, none longer than ``rows`` (default ``chunk``)."""
        n = self.q.shape[-2]
        return split(n, int(rows or self.chunk or n))

    def tiles(self) -> list[Tile]:
        """``(images, heads, queries)`` tiles covering the batch, the heads and the queries once.
        On a CPU a tile's scores stay within :data:`CPU_CHUNK_BYTES` or one head's
        :data:`CPU_TILE_ROWS` queries, whichever is more: one image's heads are split before its
        queries go below that, and several images share a tile while they fit (short products
        run slower; fewer heads do not shorten them). Elsewhere every tile spans batch and heads."""
        b, h, _, n_k = self.shape
        every = slice(0, h)
        if self.q.device.type != "cpu":
            return [(slice(0, b), every, sl) for sl in self.slices()]
        per_row = 4 * h * n_k  # bytes of one query's scores in one image
        fit = max(CPU_TILE_ROWS, CPU_CHUNK_BYTES // per_row)
        slices = self.slices(max(1, min(int(self.chunk or 1), fit)))
        rows = max(sl.stop - sl.start for sl in slices)
        heads = split(h, CPU_CHUNK_BYTES // (4 * rows * n_k))
        group = max(1, min(b, CPU_CHUNK_BYTES // (per_row * rows)))
        return [
            (slice(i, min(i + group, b)), hs, sl)
            for i in range(0, b, group)
            for hs in heads
            for sl in slices
        ]

    def _bias(
        self,
        rows: slice,
        bi: torch.Tensor | None = None,
        hi: torch.Tensor | None = None,
        tile: tuple[slice, slice] | None = None,
    ) -> torch.Tensor | None:
        """The additive mask of query rows ``rows`` (``[.., rows, N_k]``, broadcastable) in
        base-2 units, at the heads ``(bi, hi)`` or of the ``(images, heads)`` of a tile when
        given; None without a mask."""
        n_k = self.k.shape[-2]
        if self.is_causal:
            n = rows.stop - rows.start
            bias = self.q.new_full((n, n_k), float("-inf"), dtype=torch.float32)
            return bias.triu_(rows.start + 1)
        if self.attn_mask is None:
            return None
        if "mask" not in self._memo:  # converted once, sliced for every chunk
            self._memo["mask"] = mask_bias(self.attn_mask, torch.float32).float() * LOG2E
        m = self._memo["mask"]
        if m.dim() >= 2 and m.shape[-2] != 1:
            m = m[..., rows, :]
        if tile is not None and m.dim() >= 3 and m.shape[-3] != 1:
            m = m[..., tile[1], :, :]
        if tile is not None and m.dim() == 4 and m.shape[0] != 1:
            m = m[tile[0]]
        return m if bi is None else self._per_head(m)[bi, hi]

    def _per_head(self, bias: torch.Tensor) -> torch.Tensor:
        """A broadcastable ``[.., n, N_k]`` bias expanded to ``[B, H, n, N_k]`` (a view)."""
        b, h = self.q.shape[:2]
        while bias.dim() < 4:
            bias = bias.unsqueeze(0)
        return bias.expand(b, h, *bias.shape[-2:])

    def scaled_q(self, q: torch.Tensor) -> torch.Tensor:
        """``q * scale * log2(e)`` of some of the queries: scores in base-2 units (queries are
        scaled where they are read, so no pass holds a scaled copy of them all)."""
        return q * (self.scale * LOG2E)

    def _operands(self, tiles: list[Tile]) -> tuple[torch.Tensor | None, torch.Tensor]:
        """What the tiles' products read: with one image per tile, q is scaled tile by tile
        (None here) and k is read in place (one image's heads are a strided batch the product
        reads as it is); when tiles span several images (small images, where the copies are
        small), ``q * scale * log2(e)`` and ``k`` contiguous, made once (memoised: several
        images' heads are not one strided batch, and each tile's product would copy them)."""
        if all(i.stop - i.start == 1 for i, _, _ in tiles):
            return None, self.k
        if "q" not in self._memo:
            self._memo["q"] = self.scaled_q(self.q)
            self._memo["k"] = self.k.contiguous()
        return self._memo["q"], self._memo["k"]

    def _scores(
        self,
        qs: torch.Tensor,
        k: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``qs @ k^T (+ bias)`` in float32, written into the flat buffer ``out`` when given (one
        buffer for every chunk: fresh large tensors would fault their pages in each time)."""
        if out is not None and qs.dtype == torch.float32:
            shape = (*qs.shape[:-1], k.shape[-2])
            scores = torch.matmul(qs, k.transpose(-2, -1), out=out[: math.prod(shape)].view(shape))
        else:
            scores = (qs @ k.transpose(-2, -1)).float()
        return scores if bias is None else scores.add_(bias)

    def rows(self, rows: slice) -> torch.Tensor:
        """Probabilities of the queries ``rows``: ``[B, H, n, N_k]`` float32."""
        qs = self.scaled_q(self.q[:, :, rows])
        scores = self._scores(qs, self.k, self._bias(rows))
        e = scores.sub_(scores.amax(-1, keepdim=True)).exp2_()
        return e.div_(e.sum(-1, keepdim=True))

    def _scan(
        self,
        row_fns: dict[str, Callable[[torch.Tensor], torch.Tensor]],
        v: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """One pass over the tiles: column sums, row log-sum-exp, and the per-row values of
        ``row_fns`` (each ``[B, H, n]`` of the tile's rows), memoised by name; with values
        ``v [B, H, N_k, Dv]`` also the attention output ``P @ v`` (returned, laid out as
        ``[B, N, H, Dv]`` as the CPU's fused kernel lays it out)."""
        b, h, n, n_k = self.shape
        col = self.q.new_zeros((b, h, n_k), dtype=torch.float32)
        lse, total = (self.q.new_empty((b, h, n), dtype=torch.float32) for _ in range(2))
        per_row = {k: self.q.new_empty((b, h, n), dtype=torch.float32) for k in row_fns}
        out = None if v is None else v.new_empty((b, n, h, v.shape[-1])).transpose(1, 2)
        with torch.autocast(self.q.device.type, enabled=False):  # sums stay in float32
            self._chunks(_Sums(col, lse, total, row_fns, per_row, v, out))
        lse.mul_(LN2).add_(total.log_())  # row maxima in base 2 -> ln sum exp
        self._memo.update({"column_sum": col, "lse": lse, **per_row})
        return out

    def _chunks(self, sums: _Sums) -> None:
        """The body of :meth:`_scan`: fills ``sums`` tile by tile, from scores in base 2
        (``e = 2^(s - top)``, ``lse = top ln 2 + ln sum e``)."""
        tiles = self.tiles()
        size = max(
            (i.stop - i.start) * (hs.stop - hs.start) * (sl.stop - sl.start) for i, hs, sl in tiles
        )
        q, k = self._operands(tiles)
        # tiles of several images (small images, short passes) reuse the kept buffer; one
        # image's tiles (long passes) free theirs: kept across the MLP it would pin a hole in
        # the heap that the next block's large buffers cannot reuse
        buf = scratch(size * self.k.shape[-2], self.q, keep=q is not None)
        v = None if sums.v is None else sums.v.float()
        v = v if v is None or q is None else v.contiguous()
        for i, hs, sl in tiles:
            qs = self.scaled_q(self.q[i, hs, sl]) if q is None else q[i, hs, sl]
            scores = self._scores(qs, k[i, hs], self._bias(sl, tile=(i, hs)), buf)
            top = torch.amax(scores, -1, out=sums.top[i, hs, sl]).unsqueeze(-1)
            e = scores.sub_(top).exp2_()
            total = torch.sum(e, -1, out=sums.total[i, hs, sl]).unsqueeze(-1)
            inv = total.reciprocal()
            if v is not None and sums.out is not None:  # the attention output of these rows
                torch.mul(e @ v[i, hs], inv, out=sums.out[i, hs, sl])
            if not sums.row_fns:  # column sums of e / total without dividing e
                sums.col[i, hs] += (inv.transpose(-2, -1) @ e).squeeze(-2)
                continue
            p = e.div_(total)
            sums.col[i, hs] += p.sum(-2)
            for name, fn in sums.row_fns.items():
                sums.per_row[name][i, hs, sl] = fn(p)

    def attend(self, v: torch.Tensor) -> torch.Tensor:
        """The attention output ``P @ v`` (``v [B, H, N_k, Dv]``, in ``v``'s dtype), computed
        with the column sums and row log-sum-exp in one pass over the query chunks."""
        out = self._scan({}, v)
        assert out is not None
        return out

    def memo(self, name: str, row_fns: dict[str, Callable] | None = None) -> torch.Tensor:
        """A statistic of the first pass (``column_sum``, ``lse`` or a row function's name)."""
        missing = {k: f for k, f in (row_fns or {}).items() if k not in self._memo}
        if name not in self._memo or missing:
            self._scan(missing)
        return self._memo[name]

    def head_rows(self, bi: torch.Tensor, hi: torch.Tensor) -> Iterator[torch.Tensor]:
        """Probabilities of heads ``(bi, hi)`` (``[E, n, N_k]`` float32), chunk by chunk."""
        lse = self.memo("lse")[bi, hi] * LOG2E
        q, k = self.q[bi, hi], self.k[bi, hi]
        for sl in self.slices():
            scores = self._scores(self.scaled_q(q[:, sl]), k, self._bias(sl, bi, hi))
            yield scores.sub_(lse[:, sl, None]).exp2_()


def column_mean(p: torch.Tensor | StreamedPattern) -> torch.Tensor:
    """Mean attention each key receives over the queries: ``[B, H, N_k]`` float32."""
    if isinstance(p, StreamedPattern):
        return p.memo("column_sum") / p.shape[2]
    return p.float().mean(dim=2)


def query_rows(p: torch.Tensor | StreamedPattern, rows: slice) -> torch.Tensor:
    """The rows of queries ``rows``: ``[B, H, n, N_k]``."""
    if isinstance(p, StreamedPattern):
        return p.rows(rows)
    return p[:, :, rows]


def key_column(p: torch.Tensor | StreamedPattern, key: torch.Tensor) -> torch.Tensor:
    """``A[b, h, :, key[b, h]]``: what every query puts on one key per head, ``[B, H, N]``."""
    b, h, n, _ = p.shape
    if not isinstance(p, StreamedPattern):
        return p.float().gather(3, key[:, :, None, None].expand(b, h, n, 1)).squeeze(-1)
    index = key[:, :, None, None]
    kk = p.k.gather(2, index.expand(b, h, 1, p.k.shape[-1])).transpose(-2, -1)  # [B, H, D, 1]
    scores = torch.cat([p.scaled_q(p.q[:, :, sl]) @ kk for sl in p.slices()], 2).float()
    if p.is_causal:
        late = key[:, :, None, None] > torch.arange(n, device=key.device)[:, None]
        scores = scores.masked_fill(late, float("-inf"))
    elif p.attn_mask is not None:
        bias = p._per_head(p._bias(slice(0, n))).expand(b, h, n, -1)
        scores = scores + bias.gather(3, index.expand(b, h, n, 1))
    return (scores.squeeze(-1) - p.memo("lse") * LOG2E).exp2()


def head_gram(
    p: torch.Tensor | StreamedPattern, bi: torch.Tensor, hi: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """``(A v)^T (A v)`` in float64 for heads ``(bi, hi)`` with values ``v [E, N_k, D]``."""
    if not isinstance(p, StreamedPattern):
        z = (p.float()[bi, hi] @ v).double()
        return z.transpose(-1, -2) @ z
    gram = v.new_zeros((v.shape[0], v.shape[-1], v.shape[-1]), dtype=torch.float64)
    for a in p.head_rows(bi, hi):
        z = (a @ v).double()
        gram += z.transpose(-1, -2) @ z
    return gram


def row_means(p: StreamedPattern, ks: Sequence[int]) -> dict[str, torch.Tensor]:
    """Per image ``[B]``: top-k key mass and entropy (nats) of every row, averaged over heads
    and queries (the streamed form of :func:`vitreg.analysis.attention.row_stats`)."""
    n_k = p.shape[-1]
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        f"top{k}": (lambda a, k=k: a.topk(min(k, n_k), dim=-1).values.sum(-1)) for k in ks
    }
    fns["entropy"] = lambda a: -torch.special.xlogy(a, a).sum(-1)
    return {name: p.memo(name, fns).mean((1, 2)) for name in fns}
