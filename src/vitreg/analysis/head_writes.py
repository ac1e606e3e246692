"""What each attention head writes into the residual stream: its columns of the output projection
W_O and the block's LayerScale, found on the source module of any adapter family.

The sink classes of Fesser et al. (2026) compare the norms of ``u_j = gamma * W_O^h v_j`` (the
head's value vectors as the residual stream receives them), so they need W_O per head and the
LayerScale ``gamma`` of the attention branch. Known layouts: timm ViT (``attn.proj``,
``ls1.gamma``), timm Eva (``attn.proj``, ``gamma_1``; not with a sub-LayerNorm before ``proj``),
HF CLIP/SigLIP (``out_proj``), HF ViT/DINOv2 (``attention.output.dense``, ``layer_scale1.lambda1``)
and open_clip (``attn.out_proj``, ``ls_1.gamma``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitreg.errors import UnsupportedModelError
from vitreg.hooks.attention import PatternSite
from vitreg.models.model import Model

_PROJ = ("proj", "out_proj")
_SCALE = (("ls1", "gamma"), ("gamma_1", None), ("layer_scale1", "lambda1"), ("ls_1", "gamma"))


@dataclass(frozen=True)
class HeadWrites:
    """Per-head output projection ``w [C, H, D]`` and LayerScale ``gamma [C]`` (None: 1)."""

    w: torch.Tensor
    gamma: torch.Tensor | None

    def value_metric(self) -> torch.Tensor:
        """``[H, D, D]``: ``M_h = W_h^T diag(gamma^2) W_h``, so ``||u_j||^2 = v_j^T M_h v_j``."""
        w = self.w if self.gamma is None else self.w * self.gamma[:, None, None]
        per_head = w.permute(1, 0, 2)  # [H, C, D]
        return per_head.transpose(1, 2) @ per_head


def _parents(root: nn.Module) -> dict[int, nn.Module]:
    return {id(child): mod for mod in root.modules() for child in mod.children()}


def _linear(module: nn.Module, names: tuple[str, ...]) -> nn.Linear | None:
    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, nn.Linear):
            return found
    return None


def _gamma(module: nn.Module) -> torch.Tensor | None:
    for name, leaf in _SCALE:
        found = getattr(module, name, None)
        found = getattr(found, leaf, None) if leaf and found is not None else found
        if isinstance(found, torch.Tensor):
            return found.detach()
    return None


def head_writes(model: Model, layer: int) -> HeadWrites:
    """W_O and LayerScale of block ``layer``'s attention (:class:`UnsupportedModelError` when the
    module's layout is not one vitreg knows, or the head update is not linear in the values)."""
    site = model.site(f"blocks.{layer}.attn.hook_pattern")
    attn = getattr(site, "attn", None) if isinstance(site, PatternSite) else None
    if attn is None:
        raise UnsupportedModelError(f"block {layer}: no attention module behind its pattern site")
    if not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
        raise UnsupportedModelError(
            f"block {layer}: a LayerNorm sits between the heads and W_O (EVA-02 sub-LN), so the "
            "head update is not W_O applied to the attended values"
        )
    parents = _parents(model.module)
    chain = [attn]
    while id(chain[-1]) in parents and len(chain) < 4:
        chain.append(parents[id(chain[-1])])
    proj = next((p for m in chain if (p := _linear(m, _PROJ)) is not None), None)
    if proj is None:
        output = next((getattr(m, "output", None) for m in chain if hasattr(m, "output")), None)
        proj = _linear(output, ("dense",)) if output is not None else None
    if proj is None:
        raise UnsupportedModelError(f"block {layer}: no attention output projection found")
    gamma = next((g for m in chain[1:] if (g := _gamma(m)) is not None), None)
    heads = model.n_heads
    d_out, d_in = proj.weight.shape
    if d_in % heads:
        raise UnsupportedModelError(f"block {layer}: W_O input {d_in} not divisible by {heads}")
    w = proj.weight.detach().float().reshape(d_out, heads, d_in // heads)
    return HeadWrites(w, None if gamma is None else gamma.float())
