"""A small TopK sparse autoencoder (Gao et al. 2024) and its seeded training.

``z = TopK(ReLU(W_enc (x - b_dec) + b_enc))``, ``x_hat = W_dec z + b_dec``, trained on the mean
squared error with Adam for a fixed number of steps; decoder rows are kept at unit norm. Inputs
are divided by one scale per SAE (so that the training tokens' mean squared norm is the width)
and outputs multiplied back: errors are in the model's own units. Everything random (the
initialisation, the minibatches) is drawn from one ``torch.Generator`` seeded by ``seed``.
"""

from __future__ import annotations

import torch
from torch import nn

from vitreg.settings.sae import SaeSettings


class TopKSae(nn.Module):
    """A TopK SAE of ``n_latents`` latents on ``width``-dimensional tokens, ``k`` active."""

    def __init__(self, width: int, n_latents: int, k: int, generator: torch.Generator) -> None:
        super().__init__()
        dec = torch.randn(n_latents, width, generator=generator)
        dec = dec / dec.norm(dim=1, keepdim=True)
        self.w_dec = nn.Parameter(dec)
        self.w_enc = nn.Parameter(dec.t().clone())
        self.b_enc = nn.Parameter(torch.zeros(n_latents))
        self.b_dec = nn.Parameter(torch.zeros(width))
        self.k = min(k, n_latents)
        self.register_buffer("scale", torch.ones(()))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Latent activations ``[T, n_latents]`` of tokens ``x [T, width]`` (at most ``k``
        non-zero per token)."""
        pre = torch.relu((x / self.scale - self.b_dec) @ self.w_enc + self.b_enc)
        top = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, top.values)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Tokens ``[T, width]`` in the model's units from latents ``z``."""
        return (z @ self.w_dec + self.b_dec) * self.scale

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The reconstruction of ``x`` and its latents."""
        z = self.encode(x)
        return self.decode(z), z

    @torch.no_grad()
    def unit_decoder(self) -> None:
        """Every decoder row back to unit norm."""
        self.w_dec.div_(self.w_dec.norm(dim=1, keepdim=True).clamp_min(1e-8))


def train_sae(tokens: torch.Tensor, settings: SaeSettings, seed: int) -> TopKSae:
    """A TopK SAE trained on ``tokens [T, width]`` with ``settings`` (``steps`` Adam steps of
    ``tokens`` tokens drawn with replacement), everything random seeded by ``seed``."""
    if len(tokens) == 0:
        raise ValueError("an SAE needs at least one training token")
    g = torch.Generator().manual_seed(seed)
    width = tokens.shape[1]
    sae = TopKSae(width, settings.expansion * width, settings.k, g).to(tokens.device)
    with torch.no_grad():
        sae.scale.fill_(
            float(tokens.float().pow(2).sum(1).mean().div(width).sqrt().clamp_min(1e-8))
        )
        sae.b_dec.copy_(tokens.float().mean(0) / sae.scale)
    opt = torch.optim.Adam(sae.parameters(), lr=settings.lr)
    for _ in range(settings.steps):
        index = torch.randint(len(tokens), (settings.tokens,), generator=g).to(tokens.device)
        x = tokens[index].float()
        x_hat, _ = sae(x)
        loss = ((x_hat - x) / sae.scale).pow(2).sum(1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sae.unit_decoder()
    return sae.eval()
