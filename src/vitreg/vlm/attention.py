"""Language->image attention: the rows of chosen text positions over the image tokens, read
layer by layer from the language model's eager attention, and the tower's token norms at the
layer LLaVA feeds the projector.

Only the rows asked for are kept (``[heads, queries, image tokens]`` per layer, moved to the CPU
as each layer finishes); the full ``[heads, T, T]`` weights of a layer are dropped when the
layer returns, so no two layers' full attention tensors are alive at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import HookContext
from vitreg.models.loaders.hf_vlm import VLM, vlm_of
from vitreg.models.model import Model
from vitreg.vlm.taxonomy import DEFAULT_K, SiteTokens, capture_sites


@dataclass
class ImageAttention:
    """Attention of text rows ``positions`` over the image tokens: ``rows [L, H, Q, n_img]``."""

    positions: list[int]
    rows: torch.Tensor

    @property
    def mass(self) -> torch.Tensor:
        """``[L, H, Q]``: the attention each row puts on the image tokens in all."""
        return self.rows.sum(-1)

    def layer_maps(self) -> torch.Tensor:
        """``[L, n_img]``: per layer, averaged over heads and rows."""
        return self.rows.mean(dim=(1, 2))

    def mean_map(self) -> torch.Tensor:
        """``[n_img]``: averaged over heads, rows and layers."""
        return self.layer_maps().mean(0)


@dataclass
class Reading:
    """One teacher-forced forward pass: the attention rows, logits at the asked positions, the
    tower's per-token norms at the feature layer (``[h, w]`` patches, inserted tokens), and the
    image tokens' nearest vocabulary ids at the language-model sites read (``{0: input, ...}``)."""

    attention: ImageAttention
    logits: torch.Tensor  # [len(logit_positions), vocab]
    norm_grid: torch.Tensor
    extra_norms: torch.Tensor  # [n_extra]: the test-time registers' norms (empty without)
    layout: TokenLayout  # the tower's layout in that pass (inserted tokens included)
    sites: dict[int, SiteTokens] = field(default_factory=dict)


def feature_site(model: Model, vlm: VLM) -> str:
    """The tower hook holding ``hidden_states[vision_feature_layer]`` (index 0: block 0's input)."""
    n = model.n_layers
    k = vlm.feature_layer
    index = k + n + 1 if k < 0 else k
    if not 0 <= index <= n:
        raise InputError(f"vision_feature_layer={k} is outside this {n}-block tower")
    return hook_name(0, "hook_resid_pre") if index == 0 else hook_name(index - 1, "hook_resid_post")


@contextmanager
def capture_rows(
    vlm: VLM, positions: Sequence[int], image_positions: torch.Tensor
) -> Iterator[list[torch.Tensor]]:
    """Collect, per language-model layer, ``[H, Q, n_img]`` attention rows (float32, CPU)."""
    store: list[torch.Tensor] = []
    rows = torch.tensor(list(positions), dtype=torch.long)

    def hook(module: torch.nn.Module, _args: tuple, out: object) -> None:
        weights = out[1] if isinstance(out, tuple) and len(out) > 1 else None
        if not isinstance(weights, torch.Tensor):
            raise InputError(
                f"the language model runs {vlm.lm_attention!r} attention, which returns no "
                "attention weights; load the VLM with attn_implementation='eager' (vitreg.load"
                "('hf-vlm:...') does) or call module.set_attn_implementation('eager')"
            )
        picked = weights[0].index_select(1, rows.to(weights.device))
        picked = picked.index_select(2, image_positions.to(weights.device))
        store.append(picked.detach().float().cpu())

    handles = [layer.self_attn.register_forward_hook(hook) for layer in vlm.lm_layers]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


def image_positions(vlm: VLM, ids: torch.Tensor) -> torch.Tensor:
    """Sequence positions of the image tokens in ``ids [1, T]``."""
    # layout: column 0 of nonzero's index pairs, not tokens
    return (ids[0] == vlm.image_token_id).nonzero()[:, 0].cpu()


def read(
    model: Model,
    ids: torch.Tensor,
    pixel_values: torch.Tensor,
    positions: Sequence[int],
    logit_positions: Sequence[int],
    sites: Sequence[int] = (0,),
    k: int = DEFAULT_K,
) -> Reading:
    """One forward pass of the VLM over ``ids`` (prompt + answer) reading attention rows,
    logits at ``logit_positions``, the tower's feature-layer norms and the image tokens'
    ``k`` nearest vocabulary ids at the language-model ``sites`` (0: its input)."""
    vlm = vlm_of(model)
    found: dict[str, torch.Tensor | TokenLayout] = {}

    def save(t: torch.Tensor, hook: HookContext) -> None:
        lay = hook.layout
        norms = t[:1].detach().float().norm(dim=-1)
        found["grid"] = lay.patch_grid(norms[..., None])[0, ..., 0].cpu()
        found["extra"] = lay.take(norms, "extra")[0].cpu()
        found["layout"] = lay

    keep = torch.tensor(list(logit_positions), dtype=torch.long, device=model.device)
    images = image_positions(vlm, ids)
    with (
        torch.no_grad(),
        model.hooks([(feature_site(model, vlm), save)]),
        capture_rows(vlm, positions, images) as rows,
        capture_sites(vlm, images, sites, k) as tokens,
    ):
        out = vlm.module(
            input_ids=ids.to(model.device),
            pixel_values=pixel_values.to(device=model.device, dtype=model.dtype),
            attention_mask=torch.ones_like(ids, device=model.device),
            use_cache=False,
            logits_to_keep=keep,
        )
    return Reading(
        ImageAttention(list(positions), torch.stack(rows)),
        out.logits[0].detach().float().cpu(),
        found["grid"],
        found["extra"],
        found["layout"],
        tokens,
    )


def to_grid(model: Model, values: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """Image-token values ``[n_img]`` on the tower's patch grid ``[h, w]`` (LLaVA's "default"
    strategy dropped the first tower token, "full" kept it: prefix values are left out)."""
    layout = model.adapter.layout_for(image_size)
    full = torch.zeros(layout.n_tokens, dtype=values.dtype)
    offset = layout.n_tokens - values.shape[0]
    full[offset:] = values
    return layout.patch_grid(full[None, :, None])[0, ..., 0]
