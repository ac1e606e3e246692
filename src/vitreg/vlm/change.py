"""How much an answer changed: token edit distance, and the first answer token's distribution."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitreg.results.vlm import AnswerChange, FirstTokenChange


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two token sequences (insert, delete, substitute: cost 1)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def first_token_change(before: torch.Tensor, after: torch.Tensor) -> FirstTokenChange:
    """KL(before || after) of the next-token distributions, the largest logit change, and
    whether the most likely token stays the same (logits ``[vocab]`` each)."""
    lp_b = torch.log_softmax(before.double(), -1)
    lp_a = torch.log_softmax(after.double(), -1)
    top_b, top_a = int(before.argmax()), int(after.argmax())
    return FirstTokenChange(
        kl=float((lp_b.exp() * (lp_b - lp_a)).sum()),
        max_abs_logit_change=float((after.double() - before.double()).abs().max()),
        same_top_token=top_b == top_a,
        top_prob_before=float(lp_b[top_b].exp()),
        top_prob_after_of_before_token=float(lp_a[top_b].exp()),
    )


def answer_change(a: Sequence[int], b: Sequence[int]) -> AnswerChange:
    """Identical or not, the token edit distance and its share of the longer answer."""
    d = edit_distance(a, b)
    return AnswerChange(
        identical=list(a) == list(b),
        edit_distance=d,
        edit_distance_normalized=d / max(len(a), len(b), 1),
    )
