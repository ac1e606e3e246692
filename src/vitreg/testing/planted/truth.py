"""What a planted fixture carries: the rule that selects its outlier patches and its ground truth.

:class:`FlatRule` (texture energy below a threshold) and :class:`PositionRule` (fixed grid
positions) say which patches the planted units fire on; :class:`GroundTruth` says which units
were planted, in which roles, and how strong the outliers are.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import ConfigDict, computed_field, model_validator

from vitreg.errors import InputError
from vitreg.results.base import ResultsModel


class TruthModel(ResultsModel):
    """A planted fixture's ground truth: frozen, and its JSON (``model_dump(mode="json")``) is
    what the fixture writes beside its weights."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    def __init__(self, *args: Any, **fields: Any) -> None:
        """Fields by keyword; given by position (in declaration order), they still work for
        one release, with a ``DeprecationWarning``."""
        if args:
            names = list(type(self).model_fields)
            if len(args) > len(names):
                raise TypeError(f"{type(self).__name__} takes at most {len(names)} fields")
            warnings.warn(
                f"{type(self).__name__} takes its fields by keyword; positional ones go in the "
                "next release",
                DeprecationWarning,
                stacklevel=2,
            )
            fields = {**dict(zip(names, args, strict=False)), **fields}
        super().__init__(**fields)


def texture_filters(patch_size: int, n_filters: int, seed: int) -> torch.Tensor:
    """``[K, 3, P, P]`` unit-norm filters with zero mean per colour channel (0 on flat patches)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_filters, 3, patch_size, patch_size, generator=g)
    w = w - w.mean(dim=(2, 3), keepdim=True)
    return w / w.flatten(1).norm(dim=1)[:, None, None, None]


class FlatRule(TruthModel):
    """Which patches the planted neurons fire on: texture energy below ``threshold``.

    Texture energy of a preprocessed patch is the mean absolute response of ``n_filters``
    zero-mean random filters (``texture_filters(patch_size, n_filters, filter_seed)``); it is
    about 0.8 x the patch's pixel standard deviation, so the rule is roughly "pixel std <
    ``approx_std``" in normalised units (flat background, sky, walls).
    """

    patch_size: int
    threshold: float
    n_filters: int
    filter_seed: int

    @computed_field(repr=False)  # type: ignore[prop-decorator]
    @property
    def approx_std(self) -> float:
        return self.threshold / math.sqrt(2 / math.pi)

    @computed_field(repr=False)  # type: ignore[prop-decorator]
    @property
    def text(self) -> str:
        return (
            f"flat: patches whose texture energy (mean |response| of {self.n_filters} zero-mean "
            f"filters, preprocessed pixels) is < {self.threshold:g}, i.e. pixel std < "
            f"~{self.approx_std:.2f}"
        )

    def filters(self) -> torch.Tensor:
        return texture_filters(self.patch_size, self.n_filters, self.filter_seed)

    def texture_energy(self, images: torch.Tensor) -> torch.Tensor:
        """Per-patch texture energy ``[B, h, w]`` of preprocessed images ``[B, 3, H, W]``."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise InputError(
                f"expected preprocessed images [B, 3, H, W], got {tuple(images.shape)}"
            )
        p = self.patch_size
        if images.shape[-1] % p or images.shape[-2] % p:
            raise InputError(f"image size {tuple(images.shape[-2:])} is not a multiple of {p}")
        w = self.filters().to(images.device)
        return F.conv2d(images.float(), w, stride=p).abs().mean(dim=1)

    def mask(self, images: torch.Tensor) -> torch.Tensor:
        """Bool ``[B, h, w]``: the patches of preprocessed ``images`` the rule selects."""
        return self.texture_energy(images) < self.threshold

    def ambiguous(self, images: torch.Tensor, band: float) -> torch.Tensor:
        """Patches within ``band`` (relative) of the threshold, where the model's ramp is partial."""
        ratio = self.texture_energy(images) / self.threshold
        return (ratio > 1 - band) & (ratio < 1 + band)


class PositionRule(TruthModel):
    """Which patches the planted neurons fire on: fixed grid positions, whatever the image.

    ``positions`` index the row-major patch grid ``grid``; ``kind`` says how they were drawn
    ("positions": a few fixed positions, "random": a random subset). The flag is written by the
    position embedding, so no upstream circuit reads the pixels.
    """

    patch_size: int
    grid: tuple[int, int]
    positions: tuple[int, ...]
    kind: str = "positions"

    @computed_field(repr=False)  # type: ignore[prop-decorator]
    @property
    def text(self) -> str:
        return f"{self.kind}: patches at grid positions {list(self.positions)} of {self.grid}"

    def mask(self, images: torch.Tensor) -> torch.Tensor:
        """Bool ``[B, h, w]``: the selected positions, for every image."""
        h, w = self.grid
        if images.dim() != 4 or tuple(images.shape[-2:]) != (
            h * self.patch_size,
            w * self.patch_size,
        ):
            raise InputError(
                f"expected preprocessed images [B, 3, {h * self.patch_size}, "
                f"{w * self.patch_size}], got {tuple(images.shape)}"
            )
        m = torch.zeros(h * w, dtype=torch.bool, device=images.device)
        m[list(self.positions)] = True
        return m.view(1, h, w).expand(images.shape[0], h, w)

    def ambiguous(self, images: torch.Tensor, band: float) -> torch.Tensor:
        """No patch is near a threshold: an empty mask."""
        return torch.zeros_like(self.mask(images))


class GroundTruth(TruthModel):
    """What was planted in a fixture: where, which units, on which tokens, how strongly.

    ``units`` are ``(layer, unit)`` pairs indexing ``blocks.{layer}.mlp.hook_post``. From
    ``blocks.{first_outlier_layer}.hook_resid_post`` on, patches selected by
    :meth:`outlier_mask` have norms around ``expected_norm_ratio`` x the median patch norm;
    ``helper_units`` are the upstream circuit (texture energy in block 0, flat flag in block 1).

    ``rule`` is a :class:`FlatRule` (texture energy) or, in the plant family, a
    :class:`PositionRule`. ``writer_layers``: the blocks whose units write the outliers (the
    causal blocks, before and after emergence); ``target_ratio``: the selected patches' median
    norm over the median patch norm after the last writer block (``expected_norm_ratio`` is the
    ratio at emergence).

    Roles: ``causal_units`` is the minimal set whose zeroing removes the outliers;
    ``reader_units`` fire because a token already is an outlier (they read its direction) and
    reinforce it; ``units`` is causal + reader units. ``distractor_units`` are
    ``(layer, unit, kind)`` with kind "texture" (fire on textured patches), "cls" (fire on
    [CLS] only) or "position" (fire on textured patches at fixed positions); they do not touch
    the outliers. ``emergence_layer`` is the first block whose
    output shows the outlier mode (= ``first_outlier_layer``; causal blocks may follow it).
    """

    name: str
    architecture: str
    model_args: dict[str, Any]
    seed: int
    layers: tuple[int, ...]
    units: tuple[tuple[int, int], ...]
    rule: FlatRule | PositionRule
    first_outlier_layer: int
    expected_norm_ratio: float
    sink_layers: tuple[int, ...]
    helper_units: tuple[tuple[int, int, str], ...]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    causal_units: tuple[tuple[int, int], ...] = ()
    reader_units: tuple[tuple[int, int], ...] = ()
    distractor_units: tuple[tuple[int, int, str], ...] = ()
    emergence_layer: int | None = None  # None: first_outlier_layer
    writer_layers: tuple[int, ...] = ()  # (): the causal units' blocks
    target_ratio: float | None = None  # None: expected_norm_ratio

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        """The emergence layer, writer layers and target ratio left out: their documented
        defaults."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        if out.get("emergence_layer") is None:
            out["emergence_layer"] = out.get("first_outlier_layer")
        if not out.get("writer_layers"):
            causal = out.get("causal_units") or ()
            out["writer_layers"] = tuple(sorted({unit[0] for unit in causal}))
        if out.get("target_ratio") is None:
            out["target_ratio"] = out.get("expected_norm_ratio")
        return out

    def units_by_layer(self, role: str = "all") -> dict[int, list[int]]:
        """Units per layer; ``role``: "all" (causal + readers), "causal" or "reader"."""
        pairs = {"all": self.units, "causal": self.causal_units, "reader": self.reader_units}
        if role not in pairs:
            raise InputError(f"role must be one of {sorted(pairs)}, got {role!r}")
        out: dict[int, list[int]] = {}
        for layer, unit in pairs[role]:
            out.setdefault(layer, []).append(unit)
        return out

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Preprocess images in [0, 1] with the model's mean/std."""
        mean = torch.tensor(self.mean, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=images.device).view(1, 3, 1, 1)
        return (images - mean) / std

    def texture_energy(self, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.rule, FlatRule):
            raise InputError(f"{self.name}: a position rule reads no texture energy")
        return self.rule.texture_energy(images)

    def outlier_mask(self, images: torch.Tensor) -> torch.Tensor:
        """Bool ``[B, h, w]``: the patches of preprocessed ``images`` the rule selects."""
        return self.rule.mask(images)

    def ambiguous_mask(self, images: torch.Tensor, band: float = 0.05) -> torch.Tensor:
        """Patches within ``band`` (relative) of the threshold, where the model's ramp is partial."""
        return self.rule.ambiguous(images, band)
