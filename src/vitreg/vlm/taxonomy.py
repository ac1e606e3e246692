"""EmbedLens's sink / dead / alive taxonomy of the image tokens a VLM's language model reads
(Fan et al. 2026, arXiv 2603.00510): a token is classed by its k nearest vocabulary embeddings.

A visual token ``v`` at a language-model site (0: the input, i.e. the projector output; ``k``:
the output of decoder layer ``k``) has the ``k`` vocabulary ids with the largest cosine between
``v`` and the rows of the input-embedding matrix. It is a *sink* when one of them is a sink
anchor, else *dead* when one is a dead anchor or ``v`` is the zero vector (it has no direction,
so no nearest token: no content), else *alive*. The anchors are vocabulary ids:
given (EmbedLens uses 1141 and 26673 as sinks, 30296 as dead for LLaVA-1.5-7B, ``k = 3``) or
found on the run (:func:`find_anchors`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vitreg.analysis.rules import Z_CUT, robust_mask
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.models.loaders.hf_vlm import VLM
from vitreg.results.vlm import SiteSplit, TaxonomyAnchors

CLASSES = ("sink", "dead", "alive")
SINK, DEAD, ALIVE = range(3)
DEFAULT_K = 3  # EmbedLens's top-k
SINK_SHARE = 0.2  # a found sink anchor is the nearest token of this share of high-norm tokens
ZERO = 1e-6  # of a site's largest norm: below it a token is the zero vector (dead)
RULE = (
    "k nearest vocabulary tokens by cosine to the input-embedding matrix; sink if one is a sink "
    "anchor, else dead if one is a dead anchor or the token is the zero vector, else alive "
    "(EmbedLens, arXiv 2603.00510)"
)
FOUND_SINKS = (
    f"found: each vocabulary id that is the nearest token of at least {SINK_SHARE:.0%} of the "
    f"high-norm image tokens at the language model's input (robust z > {Z_CUT} on log norms, "
    "without the fix, all images)"
)
FOUND_DEAD = (
    "found: the nearest vocabulary id of the projector's output for an all-zero tower feature "
    "(a token that carries no image content)"
)
NO_DEAD = (
    "found: none -- the projector maps an all-zero tower feature to the zero vector, so only "
    "zero-vector tokens are dead"
)


@dataclass
class SiteTokens:
    """The image tokens at one language-model site: their ``k`` nearest vocabulary ids
    ``[n, k]`` and their L2 norms ``[n]`` (CPU)."""

    nearest: torch.Tensor
    norms: torch.Tensor


def site_name(layer: int) -> str:
    """``input`` for hidden-state index 0, else ``layer k``."""
    return "input" if layer == 0 else f"layer {layer}"


def embeddings(vlm: VLM) -> torch.Tensor:
    """The language model's input-embedding matrix ``[vocab, width]``."""
    table = vlm.module.get_input_embeddings()
    weight = getattr(table, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        raise UnsupportedModelError(
            f"{type(vlm.module).__name__} has no input-embedding matrix; the sink / dead / alive "
            "split compares image tokens with the vocabulary embeddings"
        )
    return weight


def check_sites(vlm: VLM, layers: Sequence[int] | None) -> list[int]:
    """The hidden-state indices read: 0 (the input) and each of ``layers`` in ``1..N``."""
    n = len(vlm.lm_layers)
    bad = [k for k in layers or () if not 1 <= k <= n]
    if bad:
        raise InputError(
            f"--llm-layers {bad} are outside 1..{n} (this language model has {n} decoder "
            "layers; layer k is the output of decoder layer k, the input is always read)"
        )
    return [0, *sorted(set(layers or ()))]


def check_k(vlm: VLM, k: int) -> int:
    """``k`` when it is in ``1..vocab``."""
    size = embeddings(vlm).shape[0]
    if not 1 <= k <= size:
        raise InputError(f"--taxonomy-k must be in 1..{size} (the vocabulary size), got {k}")
    return k


def unit_rows(table: torch.Tensor) -> torch.Tensor:
    """``table`` in float32 with each row scaled to length 1 (a zero row stays zero)."""
    return F.normalize(table.float(), dim=-1)


def nearest_ids(
    hidden: torch.Tensor, table: torch.Tensor, k: int, unit: bool = False
) -> torch.Tensor:
    """``[n, k]`` ids of the ``k`` rows of ``table [V, D]`` with the largest cosine to each row
    of ``hidden [n, D]`` (``unit``: ``table`` is :func:`unit_rows` already)."""
    sims = unit_rows(hidden) @ (table if unit else unit_rows(table)).T
    return sims.topk(k, dim=-1).indices


def _hidden(value: object) -> torch.Tensor:
    """A decoder layer's hidden states, whether it returns a tensor or a tuple."""
    found = value[0] if isinstance(value, tuple) else value
    if not isinstance(found, torch.Tensor):
        raise UnsupportedModelError("a decoder layer returned no hidden-state tensor")
    return found


@contextmanager
def capture_sites(
    vlm: VLM, positions: torch.Tensor, sites: Sequence[int], k: int
) -> Iterator[dict[int, SiteTokens]]:
    """While active, one forward pass fills ``{site: SiteTokens}`` for the image tokens at
    ``positions``: site 0 from decoder layer 0's input, site ``j`` from layer ``j``'s output."""
    layers, table = vlm.lm_layers, embeddings(vlm)
    units: dict[torch.device, torch.Tensor] = {}  # the unit table, once per pass and device
    found: dict[int, SiteTokens] = {}

    def keep(site: int, hidden: torch.Tensor) -> None:
        h = hidden[0].index_select(0, positions.to(hidden.device)).detach()
        if h.device not in units:
            units[h.device] = unit_rows(table.detach().to(h.device))
        nearest = nearest_ids(h, units[h.device], k, unit=True)
        found[site] = SiteTokens(nearest.cpu(), h.float().norm(dim=-1).cpu())

    def pre(_m: torch.nn.Module, args: tuple, kwargs: dict[str, torch.Tensor]) -> None:
        keep(0, _hidden(args[0] if args else kwargs["hidden_states"]))

    def post(site: int):  # noqa: ANN202 -- a forward hook
        return lambda _m, _args, out: keep(site, _hidden(out))

    handles = [
        layers[0].register_forward_pre_hook(pre, with_kwargs=True)
        if site == 0
        else layers[site - 1].register_forward_hook(post(site))
        for site in sites
    ]
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


def is_zero(norms: torch.Tensor) -> torch.Tensor:
    """``[n]`` bool: tokens whose norm is below :data:`ZERO` of the largest (all of them when
    every norm is 0)."""
    return norms <= ZERO * norms.max() if norms.numel() else norms.bool()


def classify(tokens: SiteTokens, anchors: TaxonomyAnchors) -> torch.Tensor:
    """``[n]`` class codes (:data:`SINK`, :data:`DEAD`, :data:`ALIVE`) of one site's tokens:
    a zero vector is dead; else sink first, then dead, by the ``k`` nearest ids."""
    nearest = tokens.nearest
    zero = is_zero(tokens.norms)
    sink = torch.isin(nearest, torch.tensor(anchors.sink_ids, dtype=torch.long)).any(-1) & ~zero
    dead = torch.isin(nearest, torch.tensor(anchors.dead_ids, dtype=torch.long)).any(-1) | zero
    codes = torch.full(nearest.shape[:1], ALIVE, dtype=torch.long)
    codes[dead] = DEAD
    codes[sink] = SINK
    return codes


def split(layer: int, codes: torch.Tensor) -> SiteSplit:
    """The class counts of one site's tokens."""
    counts = [int((codes == c).sum()) for c in range(3)]
    n = int(codes.numel())
    return SiteSplit(
        site=site_name(layer),
        layer=layer,
        n_tokens=n,
        sink=counts[SINK],
        dead=counts[DEAD],
        alive=counts[ALIVE],
        alive_share=counts[ALIVE] / n if n else 0.0,
    )


def splits(tokens: dict[int, SiteTokens], anchors: TaxonomyAnchors) -> list[SiteSplit]:
    """The split at every captured site, in site order."""
    return [split(s, classify(tokens[s], anchors)) for s in sorted(tokens)]


def total(parts: Sequence[Sequence[SiteSplit]]) -> list[SiteSplit]:
    """Site by site, the counts summed over images."""
    out = []
    for same in zip(*parts, strict=True):
        n = sum(p.n_tokens for p in same)
        alive = sum(p.alive for p in same)
        out.append(
            SiteSplit(
                site=same[0].site,
                layer=same[0].layer,
                n_tokens=n,
                sink=sum(p.sink for p in same),
                dead=sum(p.dead for p in same),
                alive=alive,
                alive_share=alive / n if n else 0.0,
            )
        )
    return out


def _check_ids(ids: Sequence[int], size: int, what: str) -> list[int]:
    bad = [i for i in ids if not 0 <= i < size]
    if bad:
        raise InputError(f"--{what} ids {bad} are outside the vocabulary 0..{size - 1}")
    return list(ids)


def found_sinks(inputs: Sequence[SiteTokens]) -> list[int]:
    """Sink anchors from the input tokens of every image (see :data:`FOUND_SINKS`)."""
    tops: Counter[int] = Counter()
    for t in inputs:
        flagged = robust_mask(t.norms[None])[0] & ~is_zero(t.norms)
        tops.update(int(i) for i in t.nearest[flagged, 0])
    n = sum(tops.values())
    return sorted(i for i, c in tops.items() if c >= SINK_SHARE * n)


def found_dead(vlm: VLM) -> list[int]:
    """The dead anchor (see :data:`FOUND_DEAD`): the projector applied to a zero feature; none
    when that is the zero vector too."""
    projector = vlm.projector
    first = next(projector.parameters(), None)
    width = getattr(projector, "linear_1", None)
    if first is None or not isinstance(width, torch.nn.Linear):
        raise UnsupportedModelError(
            f"the projector {type(projector).__name__} has no linear_1; pass --dead-tokens"
        )
    zero = torch.zeros(1, 1, width.in_features, device=first.device, dtype=first.dtype)
    with torch.no_grad():
        out = projector(zero)[0]
    if float(out.float().norm()) == 0.0:
        return []
    return nearest_ids(out, embeddings(vlm).to(out.device), 1)[0].tolist()


def find_anchors(
    vlm: VLM,
    inputs: Sequence[SiteTokens],
    sink_ids: Sequence[int] | None,
    dead_ids: Sequence[int] | None,
) -> TaxonomyAnchors:
    """The anchors: ``sink_ids``/``dead_ids`` when given, else found on the run."""
    size = embeddings(vlm).shape[0]
    sinks = _check_ids(sink_ids, size, "sink-tokens") if sink_ids else found_sinks(inputs)
    dead = _check_ids(dead_ids, size, "dead-tokens") if dead_ids else found_dead(vlm)
    found = FOUND_DEAD if dead else NO_DEAD
    words = vlm.tokenizer.convert_ids_to_tokens if vlm.tokenizer is not None else None
    return TaxonomyAnchors(
        sink_ids=sinks,
        dead_ids=dead,
        sink_tokens=[str(words(i)) for i in sinks] if words else [],
        dead_tokens=[str(words(i)) for i in dead] if words else [],
        sink_source="given" if sink_ids else FOUND_SINKS,
        dead_source="given" if dead_ids else found,
    )
