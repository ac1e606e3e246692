"""ActivationCache: activations recorded by ``Model.run_with_cache``, keyed by canonical hook name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase

import torch

from vitreg.core.layout import TokenLayout
from vitreg.errors import HookError


class ActivationCache(Mapping[str, torch.Tensor]):
    """Read-only mapping name -> tensor, with the layout and attention provenance of the run.

    ``layouts[name]`` is the token layout of that site (inserted tokens included; hierarchical
    stages have their own grids); ``attn_source[name]`` says whether an attention pattern was
    ``native`` or ``recomputed``.
    """

    def __init__(
        self,
        data: dict[str, torch.Tensor],
        layouts: dict[str, TokenLayout | None],
        attn_source: dict[str, str],
    ) -> None:
        self._data = data
        self.layouts = layouts
        self.attn_source = attn_source

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._data[name]
        except KeyError:
            close = [k for k in self._data if name.split(".")[-1] in k][:5]
            raise HookError(
                f"{name!r} is not in this cache; cached names include {close or list(self._data)[:5]}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def layout(self, name: str) -> TokenLayout:
        layout = self.layouts.get(name)
        if layout is None:
            raise HookError(f"{name!r} has no token layout (it is not a token sequence)")
        return layout

    def patches(self, name: str) -> torch.Tensor:
        """Patch tokens of ``name`` as a grid ``[B, h, w, ...]``, prefix and inserted tokens dropped."""
        return self.layout(name).patch_grid(self[name])

    def stack(self, pattern: str) -> torch.Tensor:
        """Stack every cached tensor whose name matches the glob ``pattern`` along a new dim 0."""
        names = [n for n in self._data if fnmatchcase(n, pattern)]
        if not names:
            raise HookError(f"no cached name matches {pattern!r}")
        return torch.stack([self._data[n] for n in names])

    def to(self, device: str | torch.device) -> ActivationCache:
        moved = {k: v.to(device) for k, v in self._data.items()}
        return ActivationCache(moved, dict(self.layouts), dict(self.attn_source))

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} tensors: {list(self._data)[:4]}...)"
