"""Batched linear probes on cached features: one pass over the data trains one head per learning
rate (a weight tensor ``[L, d, out]``), stops each head early on its loss on a held-out part of the
train set, and keeps the head whose learning rate scores best (accuracy, −MSE, −RMSE or a given
scorer; equal scores go to the lower loss).

Default grid ``DINOV2_LRS`` is the 1-2-5 series from 1e-5 to 1e-1 (13 values) that DINOv2's linear
evaluation sweeps; with standardised features it brackets the useful AdamW range (≈1e-4..1e-2) and
the SGD range (≈1e-3..1e-1) alike, so one grid serves both optimisers.

Losses: ``"ce"`` (optionally ``ignore_index``), ``"mse"`` (NaN targets ignored), ``"position"``
(cross-entropy over the N patch positions + 0.5·MSE on the normalised (row, col) read from two
extra outputs, the reassessment protocol) and ``"depth_bins"`` (DINOv2's binned linear depth head:
256 bin centres uniform or log-spaced in [min, max], depth = softmax-weighted centres, trained with
the scale-invariant log loss (SigLoss, λ=0.85) on valid pixels as DINOv2 does; its auxiliary
gradient loss is left out).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from vitreg.core.renamed import renamed
from vitreg.core.schedule import warmup_cosine
from vitreg.errors import InputError
from vitreg.probe.metrics import IGNORE_INDEX, METRICS, mean_ci
from vitreg.progress import SILENT, Progress

DINOV2_LRS: tuple[float, ...] = tuple(m * 10.0**e for e in range(-5, -1) for m in (1, 2, 5)) + (
    0.1,
)

Scorer = Callable[
    [Tensor, Tensor], Tensor
]  # (pred [L, ...], target [...]) -> score [L], higher better


@dataclass
class FitSettings:
    """The training settings of a linear-probe fit, shared by every head it trains (the
    command's config is :class:`~vitreg.configs.ProbeRunConfig`)."""

    lrs: Sequence[float] = DINOV2_LRS
    optimizer: str = "adamw"  # or "sgd" (momentum below)
    epochs: int = 30
    batch_size: int = 256  # rows per step (fit_linear)
    dense_batch_size: int = 8  # images per step (fit_dense; memory ~ L·n·out·H·W floats)
    weight_decay: float = 0.0  # on weights only, decoupled for AdamW
    momentum: float = 0.9
    warmup_epochs: float = 0.0
    cosine: bool = True
    patience: int | None = 3  # epochs without held-out improvement before a head stops
    val_fraction: float = 0.1  # held-out share of the train set for early stopping / selection
    standardize: bool = True  # z-score features with train mean/std (folded into the head)
    seeds: Sequence[int] = (0, 1, 2)
    device: str = "cpu"
    progress: Progress | None = None  # epochs of each fit and its early stop (None: silent)
    label: str = ""  # what is fitted (a feature), named in each fit's progress line


# ----------------------------------------------------------------------------- losses


def _valid_mean(values: Tensor, valid: Tensor) -> Tensor:
    """Mean over all but the first (head) dim, counting only ``valid`` entries."""
    dims = tuple(range(1, values.dim()))
    v = valid.expand_as(values)
    return torch.where(v, values, 0).sum(dims) / v.sum(dims).clamp_min(1)


class Loss:
    """A probe objective: per-head training loss, decoding of outputs, default selection score."""

    name: str
    out_dim: int

    def per_head(self, out: Tensor, y: Tensor) -> Tensor:  # out [L, M, o], y [M, ...] -> [L]
        raise NotImplementedError

    def decode(self, out: Tensor) -> Tensor:  # [..., o] -> prediction
        return out

    def score(self, pred: Tensor, y: Tensor) -> Tensor:  # [L, ...] decoded -> [L]
        raise NotImplementedError


class CrossEntropy(Loss):
    """Classification; rows whose target equals ``ignore_index`` are skipped."""

    name = "ce"

    def __init__(self, out_dim: int, ignore_index: int | None = None) -> None:
        self.out_dim, self.ignore_index = out_dim, ignore_index

    def _valid(self, y: Tensor) -> Tensor:
        return (
            y != self.ignore_index
            if self.ignore_index is not None
            else torch.ones_like(y, dtype=bool)
        )

    def per_head(self, out: Tensor, y: Tensor) -> Tensor:
        L, M, o = out.shape
        ii = self.ignore_index if self.ignore_index is not None else -100
        ce = F.cross_entropy(
            out.reshape(L * M, o), y.expand(L, M).reshape(-1), ignore_index=ii, reduction="none"
        )
        return _valid_mean(ce.view(L, M), self._valid(y))

    def decode(self, out: Tensor) -> Tensor:
        return out.argmax(-1)

    def score(self, pred: Tensor, y: Tensor) -> Tensor:
        return _valid_mean((pred == y).float(), self._valid(y))


class MSE(Loss):
    """Regression to ``out_dim`` values per row; NaN targets (e.g. invalid depth) are ignored."""

    name = "mse"

    def __init__(self, out_dim: int = 1, squeeze: bool = True) -> None:
        self.out_dim, self.squeeze = out_dim, squeeze and out_dim == 1

    def _err(self, pred: Tensor, y: Tensor) -> Tensor:
        y = y.float()
        valid = torch.isfinite(y)
        return _valid_mean((pred - y.nan_to_num()).pow(2), valid)

    def per_head(self, out: Tensor, y: Tensor) -> Tensor:
        return self._err(self.decode(out), y)

    def decode(self, out: Tensor) -> Tensor:
        return out.squeeze(-1) if self.squeeze else out

    def score(self, pred: Tensor, y: Tensor) -> Tensor:
        return -self._err(pred, y)


class Position(Loss):
    """Patch position: CE over the ``h·w`` indices + 0.5·MSE of two extra outputs against the
    (row, col) normalised to [0, 1]; decodes to the index."""

    name = "position"

    def __init__(self, grid: tuple[int, int], mse_weight: float = 0.5) -> None:
        self.grid, self.mse_weight = (int(grid[0]), int(grid[1])), mse_weight
        self.n = self.grid[0] * self.grid[1]
        self.out_dim = self.n + 2
        self._ce = CrossEntropy(self.n)

    def coords(self, index: Tensor) -> Tensor:
        """Normalised (row, col) of position indices, ``[..., 2]``."""
        h, w = self.grid
        rc = torch.stack([index // w / max(h - 1, 1), index % w / max(w - 1, 1)], -1)
        return rc.float()

    def per_head(self, out: Tensor, y: Tensor) -> Tensor:
        ce = self._ce.per_head(out[..., : self.n], y)
        mse = (out[..., self.n :] - self.coords(y)).pow(2).mean((-1, -2))
        return ce + self.mse_weight * mse

    def decode(self, out: Tensor) -> Tensor:
        return out[..., : self.n].argmax(-1)

    def score(self, pred: Tensor, y: Tensor) -> Tensor:
        return self._ce.score(pred, y)


class DepthBins(Loss):
    """DINOv2 "lin" depth: ``n_bins`` centres in [min, max] (uniform or log), depth = softmax-weighted
    centres, SigLoss (scale-invariant log, λ) on pixels with finite depth > 0."""

    name = "depth_bins"

    def __init__(
        self,
        min_depth: float = 1e-3,
        max_depth: float = 10.0,
        n_bins: int = 256,
        spacing: str = "uniform",
        lam: float = 0.85,
    ) -> None:
        if spacing not in ("uniform", "log"):
            raise InputError(f"depth bin spacing {spacing!r}: use 'uniform' or 'log'")
        self.out_dim, self.lam = n_bins, lam
        lo, hi = float(min_depth), float(max_depth)
        self.centres = (
            torch.linspace(lo, hi, n_bins)
            if spacing == "uniform"
            else torch.logspace(math.log10(lo), math.log10(hi), n_bins)
        )

    def decode(self, out: Tensor) -> Tensor:
        return out.softmax(-1) @ self.centres.to(out.device)

    def per_head(self, out: Tensor, y: Tensor) -> Tensor:
        valid = torch.isfinite(y) & (y > 0)
        g = self.decode(out).log() - torch.where(valid, y, 1.0).log()
        m1, m2 = _valid_mean(g, valid), _valid_mean(g * g, valid)
        return (m2 - self.lam * m1 * m1).clamp_min(0).add(1e-8).sqrt()

    def score(self, pred: Tensor, y: Tensor) -> Tensor:
        valid = torch.isfinite(y) & (y > 0)
        return -_valid_mean((pred - y.nan_to_num()).pow(2), valid).sqrt()


LOSSES = ("ce", "mse", "position", "depth_bins")


def make_loss(
    name: str, *, out_dim: int | None = None, y: Tensor | None = None, **kw: object
) -> Loss:
    """Build a loss by name: ``ce`` (out_dim, ignore_index), ``mse`` (out_dim or from y),
    ``position`` (grid=(h, w)), ``depth_bins`` (min_depth, max_depth, n_bins, spacing)."""
    if name == "ce":
        if out_dim is None:
            raise InputError("loss 'ce' needs out_dim (the number of classes)")
        return CrossEntropy(out_dim, ignore_index=kw.get("ignore_index"))  # type: ignore[arg-type]
    if name == "mse":
        vec = y is not None and y.dim() == 2
        dim = out_dim or (int(y.shape[-1]) if vec else 1)  # type: ignore[union-attr]
        return MSE(dim, squeeze=not vec)
    if name == "position":
        if "grid" not in kw:
            raise InputError("loss 'position' needs grid=(rows, cols) of the patch grid")
        return Position(kw["grid"])  # type: ignore[arg-type]
    if name == "depth_bins":
        return DepthBins(**kw)  # type: ignore[arg-type]
    raise InputError(f"unknown probe loss {name!r}; choose one of {', '.join(LOSSES)}")


# ----------------------------------------------------------------------------- optimiser


class BatchedOptimizer:
    """AdamW or SGD(momentum) over tensors whose first dim indexes heads, with an lr per head."""

    def __init__(
        self,
        params: Sequence[Tensor],
        kind: str = "adamw",
        weight_decay: Sequence[float] = (0.0,),
        momentum: float = 0.9,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if kind not in ("adamw", "sgd"):
            raise InputError(f"optimizer {kind!r}: use 'adamw' or 'sgd'")
        self.params, self.kind, self.wd = list(params), kind, list(weight_decay)
        self.momentum, self.betas, self.eps, self.t = momentum, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params] if kind == "adamw" else []

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor], lr: Tensor) -> None:
        """One update; ``lr [L]`` (0 freezes a head)."""
        self.t += 1
        b1, b2 = self.betas
        for i, (p, g, m) in enumerate(zip(self.params, grads, self.m, strict=True)):
            lr_b = lr.view(-1, *([1] * (p.dim() - 1)))
            if self.kind == "sgd":
                g = g + self.wd[i] * p if self.wd[i] else g
                m.mul_(self.momentum).add_(g)
                p.sub_(lr_b * m)
                continue
            v = self.v[i]
            p.mul_(1 - lr_b * self.wd[i])
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(1 - b2**self.t)).add_(self.eps)
            p.sub_(lr_b / (1 - b1**self.t) * m / denom)


# ----------------------------------------------------------------------------- heads, results


@dataclass
class LinearHead:
    """A trained head on raw (unstandardised) features: ``x @ weight + bias``."""

    weight: Tensor  # [d, out]
    bias: Tensor  # [out]
    loss: Loss
    lr: float

    def logits(self, x: Tensor) -> Tensor:
        """Raw outputs ``[..., out]`` for features ``[..., d]``."""
        return x.to(self.weight) @ self.weight + self.bias

    def predict(self, x: Tensor) -> Tensor:
        """Decoded predictions (class index, value, position index, depth) for ``[..., d]``."""
        return self.loss.decode(self.logits(x))

    def logits_dense(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        """Per-patch outputs of ``x [n, h, w, d]`` upsampled bilinearly to ``[n, out, *size]``."""
        out = self.logits(x).permute(0, 3, 1, 2)
        return F.interpolate(out, size=tuple(size), mode="bilinear", align_corners=False)

    def predict_dense(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        """Decoded dense prediction ``[n, *size]`` from upsampled outputs."""
        return self.loss.decode(self.logits_dense(x, size).movedim(1, -1))


@dataclass
class FitResult:
    """Best head (by selection score) plus every lr's head and its held-out history."""

    head: LinearHead
    heads: list[LinearHead]
    lrs: list[float]
    scores: list[float]  # selection score per lr (higher is better)
    losses: list[float]  # loss per lr on the selection data (breaks score ties)
    best_epochs: list[int]  # epoch (1-based) of the kept checkpoint per lr
    epochs_run: list[int]  # epochs trained per lr before early stopping
    seed: int

    @property
    def lr(self) -> float:
        return self.head.lr

    def predict(self, x: Tensor) -> Tensor:
        return self.head.predict(x)

    def predict_dense(self, x: Tensor, size: tuple[int, int]) -> Tensor:
        return self.head.predict_dense(x, size)


# ----------------------------------------------------------------------------- training


def _moments(x: Tensor, idx: Tensor, chunk: int = 1024) -> tuple[Tensor, Tensor]:
    """Per-feature mean and std over rows/tokens of ``x[idx]`` without a full float copy."""
    d = x.shape[-1]
    s, ss, n = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64), 0
    for part in idx.split(chunk):
        z = x[part].reshape(-1, d).double()
        s, ss, n = s + z.sum(0), ss + (z * z).sum(0), n + z.shape[0]
    mean = s / n
    std = (ss / n - mean * mean).clamp_min(0).sqrt()
    return mean.float(), std.float().clamp_min(1e-6)


@dataclass
class _Trainer:
    x: Tensor
    y: Tensor
    loss: Loss
    cfg: FitSettings
    seed: int
    size: tuple[int, int] | None = None  # label size for dense heads
    mu: Tensor = field(init=False)
    sd: Tensor = field(init=False)

    def forward(self, W: Tensor, b: Tensor, xb: Tensor) -> Tensor:
        """Outputs ``[L, M, out]``; dense: per patch, upsampled to the label size, M = n·H·W."""
        xb = ((xb.to(self.cfg.device).float() - self.mu) / self.sd).reshape(-1, W.shape[1])
        out = xb @ W + b[:, None, :]
        if self.size is None:
            return out
        L, (h, w) = W.shape[0], self.x.shape[1:3]
        n = out.shape[1] // (h * w)
        out = out.view(L * n, h, w, -1).permute(0, 3, 1, 2)
        out = F.interpolate(out, size=self.size, mode="bilinear", align_corners=False)
        return out.view(L, n, -1, *self.size).permute(0, 1, 3, 4, 2).reshape(L, -1, out.shape[1])

    def target(self, y: Tensor) -> Tensor:
        """Targets aligned with the rows of ``forward`` (dense: pixels flattened)."""
        y = y.to(self.cfg.device)
        return y.reshape(-1) if self.size else y

    def evaluate(self, W: Tensor, b: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Decoded predictions ``[L, n, ...]`` (dense: ``[L, n, H, W]``) of every head on ``x``
        and each head's loss on ``y`` (batch losses averaged, weighted by rows/pixels)."""
        bs = self.cfg.dense_batch_size if self.size else self.cfg.batch_size
        preds, total, rows = [], torch.zeros(W.shape[0], device=W.device), 0
        with torch.no_grad():
            for part in torch.arange(len(x)).split(bs):
                out = self.forward(W, b, x[part])
                total += self.loss.per_head(out, self.target(y[part])) * out.shape[1]
                rows += out.shape[1]
                pred = self.loss.decode(out)
                preds.append(pred.view(W.shape[0], len(part), *self.size) if self.size else pred)
        return torch.cat(preds, 1), total / max(rows, 1)

    def run(self, val: tuple[Tensor, Tensor] | None, scorer: Scorer | None) -> FitResult:
        """Train a head per lr on the train rows, each kept at its best epoch on the held-out
        rows, and choose the lr whose head scores best on the held-out rows (or ``val``)."""
        scorer = scorer or self.loss.score
        gen = torch.Generator().manual_seed(self.seed)
        hold, fit = self._split(gen, val)
        self._standardize(fit)
        x_hold, y_hold = self.x[hold], self.y[hold].to(self.cfg.device)
        best_W, best_b, best_epoch, epochs_run = self._train(fit, gen, x_hold, y_hold)
        sx, sy = (x_hold, y_hold) if val is None else val
        return self._select(best_W, best_b, best_epoch, epochs_run, (sx, sy), scorer)

    def _split(
        self, gen: torch.Generator, val: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """The held-out rows (``val_fraction`` of them, shuffled) and the rows to fit on."""
        cfg, n = self.cfg, len(self.x)
        order = torch.randperm(n, generator=gen)
        n_hold = max(1, round(cfg.val_fraction * n)) if cfg.val_fraction > 0 else 0
        if cfg.val_fraction > 0 and not n_hold < n:
            raise InputError(
                f"val_fraction={cfg.val_fraction} leaves no train rows of {n}: the probe needs "
                "at least 2 training samples (images, for dense heads); use more data"
            )
        if n_hold == 0 and val is None:
            raise InputError("set val_fraction > 0 or pass val=(x, y) to choose the learning rate")
        return order[:n_hold], order[n_hold:]

    def _standardize(self, fit: Tensor) -> None:
        """The feature mean and std of the fit rows (0 and 1 without ``standardize``)."""
        cfg, d = self.cfg, self.x.shape[-1]
        if cfg.standardize:
            self.mu, self.sd = (t.to(cfg.device) for t in _moments(self.x, fit))
        else:
            self.mu, self.sd = torch.zeros(d, device=cfg.device), torch.ones(d, device=cfg.device)

    def _train(
        self, fit: Tensor, gen: torch.Generator, x_hold: Tensor, y_hold: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Every lr's head trained at once, each stopped early on its held-out loss: each head's
        best weights and biases, the epoch they come from, and the epochs it ran."""
        cfg, d = self.cfg, self.x.shape[-1]
        lrs = torch.tensor(list(cfg.lrs), dtype=torch.float32, device=cfg.device)
        L, o = len(lrs), self.loss.out_dim
        W = torch.zeros(L, d, o, device=cfg.device, requires_grad=True)
        b = torch.zeros(L, o, device=cfg.device, requires_grad=True)
        opt = BatchedOptimizer([W, b], cfg.optimizer, (cfg.weight_decay, 0.0), cfg.momentum)
        best_W, best_b = W.detach().clone(), b.detach().clone()
        best = torch.full((L,), math.inf, device=cfg.device)  # held-out loss per head
        best_epoch = torch.zeros(L, dtype=torch.long)
        epochs_run = torch.zeros(L, dtype=torch.long)
        bad = torch.zeros(L, dtype=torch.long)
        active = torch.ones(L, dtype=torch.bool, device=cfg.device)

        bs = cfg.dense_batch_size if self.size else cfg.batch_size
        steps = math.ceil(len(fit) / bs)
        total, warm = cfg.epochs * steps, round(cfg.warmup_epochs * steps)
        end = 0.0 if cfg.cosine else 1.0  # lr factor: warm-up, then cosine to 0 (or constant)
        step = 0
        what = f" {cfg.label}" if cfg.label else ""
        label = f"probe fit{what}, seed {self.seed}, {L} learning rates at once (epochs)"
        stopped = None
        with (cfg.progress or SILENT)(cfg.epochs, label) as update:
            for epoch in range(1, cfg.epochs + 1):
                for part in fit[torch.randperm(len(fit), generator=gen)].split(bs):
                    out = self.forward(W, b, self.x[part])
                    per = self.loss.per_head(out, self.target(self.y[part]))
                    gW, gb = torch.autograd.grad(per.sum(), (W, b))
                    factor = warmup_cosine(step, total, 1.0, warm, end)
                    opt.step((gW, gb), lrs * factor * active)
                    step += 1
                epochs_run += active.cpu().long()
                if len(x_hold) == 0:  # no held-out rows: the last epoch is each head's best
                    best_W, best_b, best_epoch[:] = W.detach().clone(), b.detach().clone(), epoch
                    update(epoch)
                    continue
                loss = torch.nan_to_num(
                    self.evaluate(W.detach(), b.detach(), x_hold, y_hold)[1], nan=math.inf
                )
                better = active & (loss < best)
                best_W[better], best_b[better] = W.detach()[better], b.detach()[better]
                best = torch.where(better, loss, best)
                best_epoch[better.cpu()] = epoch
                bad = torch.where(better.cpu(), 0, bad + active.cpu().long())
                if cfg.patience is not None:
                    active &= (bad < cfg.patience).to(cfg.device)
                update(epoch, improving=f"{int(active.sum())}/{L} lrs")
                if not active.any():
                    stopped = epoch
                    break
            if stopped is not None and stopped < cfg.epochs:
                update(stopped, early_stop=f"epoch {stopped}, no lr better for {cfg.patience}")
        return best_W, best_b, best_epoch, epochs_run

    def _select(
        self,
        best_W: Tensor,
        best_b: Tensor,
        best_epoch: Tensor,
        epochs_run: Tensor,
        selection: tuple[Tensor, Tensor],
        scorer: Scorer,
    ) -> FitResult:
        """Every lr's head on raw features, and the one that scores best on ``selection``
        (equal scores: the lower loss)."""
        cfg, (sx, sy) = self.cfg, selection
        pred, sel_loss = self.evaluate(best_W, best_b, sx, sy)
        sel = torch.nan_to_num(scorer(pred, sy.to(cfg.device)).float(), nan=-math.inf)
        tied = sel >= sel.max() - 1e-9  # equal scores (e.g. 100% accuracy): lower loss wins
        k = int(torch.where(tied, -torch.nan_to_num(sel_loss, nan=math.inf), -math.inf).argmax())
        Wr = best_W / self.sd[None, :, None]
        br = best_b - torch.einsum("d,ldo->lo", self.mu / self.sd, best_W)
        heads = [
            LinearHead(Wr[i].cpu(), br[i].cpu(), self.loss, float(cfg.lrs[i]))
            for i in range(len(cfg.lrs))
        ]
        return FitResult(
            heads[k],
            heads,
            [float(v) for v in cfg.lrs],
            sel.cpu().tolist(),
            sel_loss.cpu().tolist(),
            best_epoch.tolist(),
            epochs_run.tolist(),
            self.seed,
        )


def _loss(loss: str | Loss, out_dim: int | None, y: Tensor, kw: dict) -> Loss:
    return make_loss(loss, out_dim=out_dim, y=y, **kw) if isinstance(loss, str) else loss


def fit_linear(
    x: Tensor,
    y: Tensor,
    loss: str | Loss,
    *,
    out_dim: int | None = None,
    config: FitSettings | None = None,
    seed: int = 0,
    val: tuple[Tensor, Tensor] | None = None,
    scorer: Scorer | None = None,
    **loss_kw: object,
) -> FitResult:
    """Train one linear head per lr on rows ``x [n, d]`` → ``y [n]`` (or ``[n, k]`` for mse) in
    one pass; keep each head's checkpoint with the lowest loss on a held-out ``val_fraction`` of
    the rows and stop it after ``patience`` epochs without improvement; pick the lr with the best
    score on ``val`` if given, else on that held-out part, ties going to the lower loss
    (``scorer`` overrides the loss's default score: accuracy, −MSE, −RMSE)."""
    cfg = config or FitSettings()
    return _Trainer(x, y, _loss(loss, out_dim, y, loss_kw), cfg, seed).run(val, scorer)


def fit_dense(
    x: Tensor,
    target: Tensor,
    loss: str | Loss,
    *,
    out_dim: int | None = None,
    config: FitSettings | None = None,
    seed: int = 0,
    val: tuple[Tensor, Tensor] | None = None,
    scorer: Scorer | None = None,
    **loss_kw: object,
) -> FitResult:
    """Linear head on each patch token of ``x [n, h, w, d]``; the loss is taken on outputs
    upsampled bilinearly to the label size of ``target [n, H, W]`` (DINOv2 linear protocol).
    Segmentation: ``loss="ce"`` (``ignore_index`` defaults to 255 here, the data convention);
    depth: ``"mse"`` (1 output, NaN = invalid) or ``"depth_bins"``. The held-out split is over
    images. Predict with ``head.predict_dense``."""
    if x.dim() != 4 or target.dim() != 3 or len(x) != len(target):
        raise InputError(
            f"fit_dense wants x [n, h, w, d] and target [n, H, W]; got {tuple(x.shape)}, {tuple(target.shape)}"
        )
    cfg = config or FitSettings()
    if loss == "ce":
        loss_kw.setdefault("ignore_index", IGNORE_INDEX)
    size = (int(target.shape[1]), int(target.shape[2]))
    return _Trainer(
        x, target, _loss(loss, out_dim, target[:1].reshape(-1), loss_kw), cfg, seed, size
    ).run(val, scorer)


@dataclass
class SeedRuns:
    """Metric values per seed (same order as ``seeds``) and the chosen lr of each seed."""

    seeds: list[int]
    values: dict[str, list[float]]
    lrs: list[float]

    def summary(self, level: float = 0.95) -> dict[str, SeedSummary]:
        """Per metric: the mean over seeds with its Student-t half-width ``ci``."""
        out = {}
        for name, vals in self.values.items():
            mean, ci = mean_ci(vals, level)
            out[name] = SeedSummary(mean, ci, vals, METRICS.get(name))
        return out


@dataclass(frozen=True)
class SeedSummary:
    """One metric over seeds: mean, half-width of its interval, the values, which way is up."""

    mean: float
    ci: float
    values: list[float]
    higher_is_better: bool | None


def fit_seeds(
    x: Tensor,
    y: Tensor,
    loss: str | Loss,
    evaluate: Callable[[FitResult], Mapping[str, float]],
    *,
    config: FitSettings | None = None,
    dense: bool = False,
    **kw: object,
) -> SeedRuns:
    """Fit once per seed in ``config.seeds`` and collect ``evaluate(result)`` metrics per seed."""
    cfg = config or FitSettings()
    fit = fit_dense if dense else fit_linear
    values: dict[str, list[float]] = {}
    lrs = []
    for seed in cfg.seeds:
        result = fit(x, y, loss, config=cfg, seed=seed, **kw)  # type: ignore[arg-type]
        lrs.append(result.lr)
        for name, v in evaluate(result).items():
            values.setdefault(name, []).append(float(v))
    return SeedRuns(list(cfg.seeds), values, lrs)


__getattr__ = renamed(__name__, {"ProbeConfig": "FitSettings"}, globals())
