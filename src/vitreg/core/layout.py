"""TokenLayout: where [CLS], registers, inserted tokens and patches sit in a token sequence.

Every index into a token sequence in vitreg goes through this class. The order is the one timm,
DINOv2 and HF use, with test-time tokens placed right after the trained prefix (rope models need
them there): ``[cls * n_cls, reg * n_reg, extra * n_extra, patch_0 .. patch_{h*w-1}]``, patches in
row-major order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from vitreg.errors import InputError


@dataclass(frozen=True)
class TokenLayout:
    """Counts and named slices of one model's token sequence at one input size."""

    n_cls: int
    n_reg: int
    grid: tuple[int, int]
    patch_size: tuple[int, int]
    n_extra: int = 0

    def __post_init__(self) -> None:
        counts = (self.n_cls, self.n_reg, self.n_extra, *self.grid)
        if any(int(c) != c or c < 0 for c in counts):
            raise ValueError(f"TokenLayout counts must be non-negative integers, got {self}")

    # counts ---------------------------------------------------------------
    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def n_prefix(self) -> int:
        """Tokens before the patches: [CLS], trained registers and inserted tokens."""
        return self.n_cls + self.n_reg + self.n_extra

    @property
    def n_source_prefix(self) -> int:
        """Prefix tokens the source model itself creates ([CLS] + trained registers)."""
        return self.n_cls + self.n_reg

    @property
    def n_tokens(self) -> int:
        return self.n_prefix + self.n_patches

    # indices and slices -----------------------------------------------------
    @property
    def cls_index(self) -> int:
        """Position of the [CLS] token (the first one, should a model have several)."""
        if not self.n_cls:
            raise ValueError(f"this layout has no [CLS] token ({self.describe()})")
        return 0

    @property
    def cls(self) -> slice:
        return slice(0, self.n_cls)

    @property
    def registers(self) -> slice:
        """Trained registers (e.g. DINOv2-reg4, DINOv3)."""
        return slice(self.n_cls, self.n_cls + self.n_reg)

    @property
    def extra(self) -> slice:
        """Tokens inserted at test time (test-time registers)."""
        return slice(self.n_source_prefix, self.n_prefix)

    @property
    def prefix(self) -> slice:
        return slice(0, self.n_prefix)

    @property
    def patches(self) -> slice:
        return slice(self.n_prefix, self.n_tokens)

    def source_indices(self) -> torch.Tensor:
        """Indices of the tokens the source model produces, i.e. everything but inserted tokens."""
        idx = list(range(self.n_source_prefix)) + list(range(self.n_prefix, self.n_tokens))
        return torch.tensor(idx, dtype=torch.long)

    # derived layouts ------------------------------------------------------
    def with_extra(self, n_extra: int) -> TokenLayout:
        """The same layout with ``n_extra`` inserted tokens."""
        return replace(self, n_extra=n_extra)

    def with_grid(self, grid: tuple[int, int]) -> TokenLayout:
        return replace(self, grid=(int(grid[0]), int(grid[1])))

    # tensor helpers ---------------------------------------------------------
    def check(self, x: torch.Tensor, dim: int = 1) -> None:
        """Raise if ``x`` does not have this layout's token count along ``dim``."""
        if x.shape[dim] != self.n_tokens:
            raise InputError(
                f"expected {self.n_tokens} tokens along dim {dim} ({self.describe()}), "
                f"got shape {tuple(x.shape)}"
            )

    def take(self, x: torch.Tensor, part: str, dim: int = 1) -> torch.Tensor:
        """Select ``part`` ('cls', 'registers', 'extra', 'prefix', 'patches') along ``dim``."""
        if part not in ("cls", "registers", "extra", "prefix", "patches"):
            raise ValueError(f"unknown token part {part!r}")
        self.check(x, dim)
        sl = getattr(self, part)
        index = [slice(None)] * x.dim()
        index[dim] = sl
        return x[tuple(index)]

    def cls_token(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The [CLS] token of ``x`` along ``dim`` (that dimension dropped), e.g. ``[B, C]``."""
        self.check(x, dim)
        return x.select(dim, self.cls_index)

    def insert(self, x: torch.Tensor, tokens: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """``x`` with ``tokens`` inserted after the prefix (after earlier inserted tokens): the
        result has the layout ``self.with_extra(self.n_extra + tokens.shape[dim])``."""
        self.check(x, dim)
        head, tail = x.narrow(dim, 0, self.n_prefix), x.narrow(dim, self.n_prefix, self.n_patches)
        return torch.cat([head, tokens, tail], dim=dim)

    def patch_grid(self, x: torch.Tensor) -> torch.Tensor:
        """Reshape the patch tokens of ``[B, N, ...]`` to ``[B, h, w, ...]`` (grids pass through)."""
        is_grid = x.dim() >= 3 and x.shape[1] != self.n_tokens and tuple(x.shape[1:3]) == self.grid
        if is_grid and self.n_prefix == 0:
            return x
        patches = self.take(x, "patches", dim=1)
        return patches.reshape(patches.shape[0], *self.grid, *patches.shape[2:])

    def strip_extra(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Drop inserted tokens, returning the sequence the source model would have made."""
        if self.n_extra == 0:
            self.check(x, dim)
            return x
        self.check(x, dim)
        return torch.index_select(x, dim, self.source_indices().to(x.device))

    def token_types(self) -> list[str]:
        """One label per token: 'cls', 'register', 'extra' or 'patch'."""
        return (
            ["cls"] * self.n_cls
            + ["register"] * self.n_reg
            + ["extra"] * self.n_extra
            + ["patch"] * self.n_patches
        )

    def describe(self) -> str:
        h, w = self.grid
        return (
            f"{self.n_cls} cls + {self.n_reg} registers + {self.n_extra} extra + "
            f"{h}x{w} patches = {self.n_tokens} tokens"
        )

    def to_dict(self) -> dict[str, int | tuple[int, int]]:
        """The fields with the prefix, patch and token counts (metrics.json's layout block)."""
        d: dict[str, int | tuple[int, int]] = asdict(self)
        d.update(n_prefix=self.n_prefix, n_patches=self.n_patches, n_tokens=self.n_tokens)
        return d
