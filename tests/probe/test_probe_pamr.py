"""PAMR against a pixel-by-pixel hand computation on a tiny image: neighbour weights from
colour differences over the local spread, edges replicated, scores averaged over steps."""

from __future__ import annotations

import math

import pytest
import torch

from vitreg.errors import InputError
from vitreg.probe.pamr import affinity, pamr


def _at(t: torch.Tensor, c: int, y: int, x: int) -> float:
    """``t[0, c]`` at ``(y, x)`` with coordinates clamped to the border (replicated edges)."""
    h, w = t.shape[-2:]
    return float(t[0, c, min(max(y, 0), h - 1), min(max(x, 0), w - 1)])


OFFSETS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]


def _hand(image: torch.Tensor, scores: torch.Tensor, steps: int, dilations: list[int]):
    channels, h, w = image.shape[1:]
    weights = {}
    for y in range(h):
        for x in range(w):
            spread = []
            for c in range(channels):
                values = [_at(image, c, y + dy * d, x + dx * d)
                          for d in dilations for dy in (-1, 0, 1) for dx in (-1, 0, 1)]  # fmt: skip
                mean = sum(values) / len(values)
                spread.append(math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)))
            logits = []
            for d in dilations:
                for dy, dx in OFFSETS:
                    diffs = [abs(_at(image, c, y + dy * d, x + dx * d) - _at(image, c, y, x))
                             / (1e-8 + 0.1 * spread[c]) for c in range(channels)]  # fmt: skip
                    logits.append(-sum(diffs) / channels)
            top = max(logits)
            exp = [math.exp(v - top) for v in logits]
            weights[y, x] = [e / sum(exp) for e in exp]
    out = scores.clone()
    for _ in range(steps):
        new = torch.zeros_like(out)
        for k in range(out.shape[1]):
            for y in range(h):
                for x in range(w):
                    neigh = [_at(out, k, y + dy * d, x + dx * d)
                             for d in dilations for dy, dx in OFFSETS]  # fmt: skip
                    new[0, k, y, x] = sum(a * b for a, b in zip(weights[y, x], neigh, strict=True))
        out = new
    return out, weights


def test_pamr_matches_the_hand_computation() -> None:
    g = torch.Generator().manual_seed(0)
    image = torch.rand(1, 3, 4, 5, generator=g)
    image[..., :, 3:] += 2.0  # an edge between columns 2 and 3
    scores = torch.rand(1, 2, 4, 5, generator=g)
    want, weights = _hand(image, scores, steps=3, dilations=[1, 2])
    got = pamr(image, scores, steps=3, dilations=[1, 2])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    aff = affinity(image, [1, 2])
    assert aff.shape == (1, 16, 4, 5)
    torch.testing.assert_close(aff[0, :, 1, 2], torch.tensor(weights[1, 2]), rtol=1e-5, atol=1e-7)
    # across the edge the weights are tiny: the pixel left of it barely reads the right side
    assert float(aff[0, 4, 1, 2]) < 1e-3  # (dy, dx) = (0, +1) at dilation 1


def test_pamr_keeps_constant_scores_and_checks_its_input() -> None:
    image = torch.rand(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    flat = torch.full((2, 4, 6, 6), 0.25)
    torch.testing.assert_close(pamr(image, flat), flat)  # weights sum to one at every pixel
    with pytest.raises(InputError, match="one size"):
        pamr(image, flat[..., :5])
    with pytest.raises(InputError, match="dilations"):
        pamr(image, flat, dilations=[0])
