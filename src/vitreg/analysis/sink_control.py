"""The sink-vs-random masking control (Wu & Summa, ICML 2026, wfz666/ICML26-attention-sink),
on the sink heads of :mod:`vitreg.analysis.sinks`.

Per batch, one clean pass records each sink head's sink key in each image: its dominant key
``s = argmax_j mean_i A_ij`` (the reference's incoming mass). Then four edited passes, each
editing every sink head at once, one key per head and image:

* score path, sink: the key leaves the softmax: its column of the head's pattern is set to 0
  and every row is renormalised over the other keys, ``A'_ij = A_ij / sum_(k != s) A_ik``
  (exactly ``softmax`` with the key's logit at ``-inf``; the reference adds a large negative
  logit, the same up to float error); the values are untouched;
* value path, sink: the key's value vector in that head is zeroed; the weights are untouched
  (the reference's ``value_method="zero"``);
* the same two edits on a random key of the same head: one key per head and image drawn
  uniformly among all keys but the sink key (seeded).

The measure is the relative change of the final features (all tokens after the final norm),
``||F' - F|| / ||F||`` per image; each mean comes with a 95% percentile bootstrap interval over
the images (1000 resamples, as the reference's ``bootstrap_ci``), and so does the paired
difference sink minus random.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from vitreg.errors import HookError, InputError, UnsupportedModelError
from vitreg.hooks.sites import HookContext
from vitreg.hooks.streamed import column_mean
from vitreg.models.model import Model, iter_batches
from vitreg.progress import Update
from vitreg.results.sink_measures import Interval, PathControl, SinkControl

N_BOOT = 1000
METHOD = (
    "per image, each sink head's dominant key (argmax of its mean attention column in the clean "
    "pass) is edited in every sink head at once; score path: the key's column is set to 0 and "
    "each row renormalised over the other keys (softmax with the key's logit at -inf), values "
    "untouched; value path: the key's value vector in that head is zeroed, weights untouched; "
    "control: the same edits on one random key per head and image (uniform over the other "
    "keys) (Wu & Summa, ICML 2026)"
)
MEASURE = (
    "relative change of the final features ||F' - F|| / ||F|| (all tokens after the final "
    "norm) per image; mean and 95% percentile bootstrap interval over images"
)
Heads = Sequence[tuple[int, int]]  # (block, head)
Keys = dict[tuple[int, int], torch.Tensor]  # (block, head) -> [B] key index per image


def check_control(model: Model, heads: Heads) -> None:
    """Named errors where the control cannot edit ``heads`` of ``model``."""
    for block, head in heads:
        if not 0 <= block < model.n_layers:
            raise InputError(f"block {block} is outside the model's {model.n_layers} blocks")
        if head < 0:
            raise InputError(f"head {head} of block {block} is not a head index")
        for site in ("attn.hook_pattern", "attn.hook_v"):
            name = f"blocks.{block}.{site}"
            if name not in model.hook_names():
                raise UnsupportedModelError(
                    f"the sink control needs {name!r}, which this model lacks"
                )
        try:
            model.site(f"blocks.{block}.attn.hook_pattern").resolve_source("native")
        except HookError as e:
            raise UnsupportedModelError(
                f"the score-path edit replaces the attention probabilities, which block {block} "
                f"computes inside a fused kernel only: {e}"
            ) from e


def _score_edit(heads: list[int], keys: Keys, block: int) -> Callable:
    def fn(p: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        new = p.clone()
        rows = torch.arange(p.shape[0], device=p.device)
        for h in heads:
            k = keys[(block, h)].to(p.device)
            new[rows, h, :, k] = 0.0
            rest = new[:, h].sum(-1, keepdim=True)
            new[:, h] = new[:, h] / rest.clamp_min(torch.finfo(new.dtype).tiny)
        return new

    return fn


def _value_edit(heads: list[int], keys: Keys, block: int) -> Callable:
    def fn(v: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        new = v.clone()
        rows = torch.arange(v.shape[0], device=v.device)
        for h in heads:
            if h >= v.shape[2]:
                raise UnsupportedModelError(
                    f"block {block} has {v.shape[2]} value heads; head {h} shares another's values"
                )
            new[rows, keys[(block, h)].to(v.device), h] = 0.0
        return new

    return fn


def _by_block(heads: Heads) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for b, h in heads:
        out.setdefault(b, []).append(h)
    return out


def _clean(model: Model, x: torch.Tensor, heads: Heads) -> tuple[torch.Tensor, Keys, int]:
    """Clean features, each head's sink key per image, and the number of keys."""
    keys: Keys = {}
    n_keys = [0]

    def grab(block: int, hs: list[int]) -> Callable:
        def fn(p: Any, ctx: HookContext) -> None:
            cols = column_mean(p)  # [B, H, N_k]
            n_keys[0] = cols.shape[-1]
            for h in hs:
                keys[(block, h)] = cols[:, h].argmax(-1).cpu()

        return fn

    hooks = [(f"blocks.{b}.attn.hook_pattern", grab(b, hs)) for b, hs in _by_block(heads).items()]
    with torch.no_grad(), model.hooks(hooks, "native"):
        feats = model.features(x)
    return feats, keys, n_keys[0]


def _random_keys(keys: Keys, n_keys: int, g: torch.Generator) -> Keys:
    """One key per image and head, uniform over all keys but the sink key."""
    out: Keys = {}
    for hk, s in keys.items():
        r = torch.randint(0, n_keys - 1, s.shape, generator=g)
        out[hk] = r + (r >= s).long()
    return out


def _keep(p: torch.Tensor, ctx: HookContext) -> None:
    """A pattern hook that changes nothing (it keeps the edited blocks on the unfused path)."""


def _edited(model: Model, x: torch.Tensor, heads: Heads, keys: Keys, path: str) -> torch.Tensor:
    """Final features with ``keys`` edited on ``path``; every pass (the clean one too) runs the
    edited blocks' attention unfused, so the passes differ by the edit alone."""
    hooks = []
    for b, hs in _by_block(heads).items():
        pattern = f"blocks.{b}.attn.hook_pattern"
        if path == "score":
            hooks.append((pattern, _score_edit(hs, keys, b)))
        else:
            hooks += [(pattern, _keep), (f"blocks.{b}.attn.hook_v", _value_edit(hs, keys, b))]
    try:
        with torch.no_grad(), model.hooks(hooks, "native"):
            return model.features(x)
    except HookError as e:  # a site that reads but cannot take an edited tensor back
        raise UnsupportedModelError(
            f"the sink control cannot edit this model's {path} path: {e}"
        ) from e


def _change(edited: torch.Tensor, clean: torch.Tensor) -> np.ndarray:
    diff = (edited.double() - clean.double()).flatten(1).norm(dim=-1)
    return (diff / clean.double().flatten(1).norm(dim=-1).clamp_min(1e-30)).cpu().numpy()


def bootstrap(values: np.ndarray, rng: np.random.Generator, n_boot: int = N_BOOT) -> Interval:
    """Mean of ``values`` and its 95% percentile bootstrap interval."""
    means = values[rng.integers(0, len(values), (n_boot, len(values)))].mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return Interval(mean=float(values.mean()), low=float(low), high=float(high))


def _path(sink: np.ndarray, rand: np.ndarray, rng: np.random.Generator) -> PathControl:
    r = float(rand.mean())
    return PathControl(
        sink=bootstrap(sink, rng),
        random=bootstrap(rand, rng),
        difference=bootstrap(sink - rand, rng),
        ratio=float(sink.mean()) / r if r > 0 else None,
    )


def sink_control(
    model: Model,
    data: Any,
    heads: Heads,
    *,
    batch_size: int = 32,
    limit: int | None = None,
    seed: int = 0,
    progress: Update | None = None,
) -> SinkControl:
    """The control on ``heads`` ((block, head) pairs) over ``data``."""
    heads = sorted(set(heads))
    base = dict(method=METHOD, measure=MEASURE, heads=[list(h) for h in heads], keys_per_head=1)
    if not heads:
        note = "no sink head to edit: the control needs a head with sink events"
        return SinkControl(**base, n_images=0, seed=seed, score=None, value=None, notes=[note])
    check_control(model, heads)
    g = torch.Generator().manual_seed(seed)
    changes: dict[str, list[np.ndarray]] = {k: [] for k in ("ss", "sr", "vs", "vr")}
    done = 0
    for x in iter_batches(data, batch_size, limit):
        clean, keys, n_keys = _clean(model, x, heads)
        rand = _random_keys(keys, n_keys, g)
        for name, path, k in [
            ("ss", "score", keys),
            ("sr", "score", rand),
            ("vs", "value", keys),
            ("vr", "value", rand),
        ]:
            changes[name].append(_change(_edited(model, x, heads, k, path), clean))
        done += x.shape[0]
        if progress is not None:
            progress(done)
    if done == 0:
        raise InputError("the sink control got no images")
    c = {k: np.concatenate(v) for k, v in changes.items()}
    rng = np.random.default_rng(seed)
    return SinkControl(
        **base,
        n_images=done,
        seed=seed,
        score=_path(c["ss"], c["sr"], rng),
        value=_path(c["vs"], c["vr"], rng),
        notes=[],
    )
