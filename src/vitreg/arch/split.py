"""Token-type specialisation: one module copy for the global stream, one for the patch stream.

The sequence is ``[CLS, registers, (inserted), patches]`` (``vitreg.core.layout.TokenLayout``).
``TokenSplit`` sends the first ``n_global`` tokens ([CLS], plus the registers when they join the
[CLS] stream) through ``glob`` and the rest through ``patch``: two slices and one concatenation,
so every token passes through exactly one copy and the FLOPs equal the shared module's.
``n_global`` is fixed when the model is specialised: tokens inserted later after the prefix
(vitreg's ``insert_tokens``, test-time registers) go through the patch copies.
"""

from __future__ import annotations

import copy

import torch
from timm.layers import LayerScale
from torch import nn


class TokenSplit(nn.Module):
    """Apply ``glob`` to tokens ``[:n_global]`` and ``patch`` to the rest of a ``[B, N, ...]`` input."""

    def __init__(self, module: nn.Module, n_global: int, component: str) -> None:
        super().__init__()
        self.glob = copy.deepcopy(module)  # a clone: the split model equals the shared one at init
        self.patch = module
        self.n_global = n_global
        self.component = component

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.n_global
        # layout: runs inside the timm model on any sequence; n_global ([CLS] (+ registers))
        return torch.cat([self.glob(x[:, :n]), self.patch(x[:, n:])], dim=1)

    def extra_repr(self) -> str:
        return f"component={self.component!r}, n_global={self.n_global}"


class LayerScaleSplit(TokenSplit):
    """LayerScale split as one multiply by a per-token gain table (no slicing or concatenation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, rest = self.n_global, x.shape[1] - self.n_global
        gamma = torch.cat([self.glob.gamma.expand(n, -1), self.patch.gamma.expand(rest, -1)])
        return x * gamma


class LayerNormSplit(TokenSplit):
    """LayerNorm split: the patch copy normalises the sequence in one fused pass, then the global
    copy's output replaces the first ``n_global`` rows (cheaper than slicing the long patch part).

    Each output row (and its gradient) still comes from exactly one copy.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.n_global
        out = self.patch(x)
        out[:, :n] = self.glob(x[:, :n])  # layout: n_global is fixed at specialisation
        return out


def split(module: nn.Module, n_global: int, component: str) -> TokenSplit:
    """The two-copy version of ``module`` (both copies equal to it)."""
    if type(module) is LayerScale and not module.inplace:
        return LayerScaleSplit(module, n_global, component)
    if isinstance(module, nn.LayerNorm):
        return LayerNormSplit(module, n_global, component)
    return TokenSplit(module, n_global, component)
