"""Attention with an attention-bias slot (Sun et al. 2024; An et al., ICLR 2025).

Each head gets one learnable key ``k_bias`` and value ``v_bias`` (shape ``[1, H, 1, head_dim]``,
N(0, 0.02) init), prepended to K and V after the head split and after q/k norm. The slot has no
query and no output row, so the sequence length is unchanged; attention stays one call (SDPA on
timm's fused path). On the unfused path ``attn_drop`` (vitreg's native ``hook_pattern``) sees the
probabilities of the real tokens only, ``[B, H, N, N]``: rows then sum to 1 - the slot's mass.
:meth:`BiasAttention.recompute_pattern` gives the same columns on the fused path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.layers.attention import resolve_self_attn_mask
from torch import nn

from vitreg.errors import UnsupportedModelError

BIAS_STD = 0.02


class BiasAttention(Attention):
    """timm ``Attention`` plus the attention-bias key/value slot (``k_bias``, ``v_bias``)."""

    k_bias: nn.Parameter
    v_bias: nn.Parameter

    @classmethod
    def from_attention(cls, attn: nn.Module, std: float = BIAS_STD) -> BiasAttention:
        """Turn a timm ``Attention`` into a ``BiasAttention`` in place, with a new N(0, std) slot."""
        if type(attn) is not Attention:
            raise UnsupportedModelError(
                f"attn_bias needs timm's Attention in every block, found {type(attn).__name__}"
            )
        ref = next(attn.parameters())
        shape = (1, attn.num_heads, 1, attn.head_dim)
        attn.__class__ = cls
        for name in ("k_bias", "v_bias"):
            slot = torch.empty(shape, device=ref.device, dtype=ref.dtype).normal_(0.0, std)
            attn.register_parameter(name, nn.Parameter(slot))
        return attn

    def to_attention(self) -> Attention:
        """Drop the slot and turn back into a plain timm ``Attention`` (in place)."""
        del self.k_bias, self.v_bias
        self.__class__ = Attention
        return self

    def _with_slot(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = k.shape[0]
        kb = self.k_bias.to(k.dtype).expand(b, -1, -1, -1)
        vb = self.v_bias.to(v.dtype).expand(b, -1, -1, -1)
        return torch.cat([kb, k], dim=2), torch.cat([vb, v], dim=2)

    def _slot_mask(
        self, n: int, ref: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
    ) -> torch.Tensor | None:
        """The additive mask over ``[slot, tokens]``: the slot column is visible to every query."""
        bias = resolve_self_attn_mask(n, ref, attn_mask, is_causal)
        return None if bias is None else F.pad(bias, (1, 0))

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        k, v = self._with_slot(k, v)
        mask = self._slot_mask(N, q, attn_mask, is_causal)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.attn_drop.p if self.training else 0.0
            )
        else:
            scores = (q * self.scale) @ k.transpose(-2, -1)
            if mask is not None:
                scores = scores + mask
            probs = scores.softmax(dim=-1)
            sink = F.dropout(probs[..., :1], self.attn_drop.p, self.training)
            real = self.attn_drop(probs[..., 1:])  # vitreg's native hook_pattern reads this
            x = sink * v[:, :, :1] + real @ v[:, :, 1:]
        x = x.transpose(1, 2).reshape(B, N, self.attn_dim)
        x = self.norm(x)
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))

    def recompute_pattern(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Real-token columns of the probabilities from q/k ``[B, H, N, D]`` (after q/k norm)."""
        kb = self.k_bias.to(k.dtype).expand(k.shape[0], -1, -1, -1)
        scores = (q * self.scale) @ torch.cat([kb, k], dim=2).transpose(-2, -1)
        mask = self._slot_mask(q.shape[-2], q, attn_mask, is_causal)
        if mask is not None:
            scores = scores + mask
        return scores.softmax(dim=-1)[..., 1:]
