"""Adapter base class and registry: one adapter per model family, wrapping the source module.

An adapter never re-implements a model. It knows where the canonical hook sites live in the
source module, how to read the token layout, how to insert tokens while keeping the source's own
bookkeeping right, and which preprocessing the source expects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.core.registry import Registry
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.hooks.sites import EmbedSite, Handle, Site

# values_fn(batch_size, like) -> [B, k, C] tensor of inserted token values
ValuesFn = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Family:
    """A model family an adapter wraps, as ``vitreg models`` lists it: where it comes from, how
    to name it, what to watch out for (facts from reference/timm_internals.md, §3, §6, §7)."""

    key: str
    name: str
    library: str  # import name of the library that builds the module
    examples: tuple[str, ...]
    notes: tuple[str, ...]
    extra: str | None = None  # pip extra that installs ``library`` (None: a core dependency)
    adapter: str = ""  # the ``family`` of the adapter that wraps it (filled by the listing)

    def to_dict(self) -> dict[str, str | tuple[str, ...] | None]:
        """The fields, as ``vitreg models`` lists them."""
        return asdict(self)


class Adapter(ABC):
    """Binds vitreg's vocabulary to one family of source modules."""

    family: ClassVar[str]
    source: ClassVar[str]
    # the model families this adapter wraps (its own, not a parent's), for ``vitreg models``
    families: ClassVar[tuple[Family, ...]] = ()
    hierarchical: ClassVar[bool] = False
    supports_insertion: ClassVar[bool] = True
    # True when the source's own outputs (and so ``features``) already exclude inserted tokens
    strips_extra: ClassVar[bool] = False

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.notes: list[str] = []
        self._sites: dict[str, Site] | None = None

    # identification ----------------------------------------------------------
    @classmethod
    @abstractmethod
    def matches(cls, module: nn.Module) -> bool:
        """True if this adapter handles ``module``."""

    # structure -------------------------------------------------------------
    @property
    @abstractmethod
    def n_layers(self) -> int: ...

    @property
    @abstractmethod
    def d_model(self) -> int: ...

    @property
    @abstractmethod
    def d_mlp(self) -> int: ...

    @property
    @abstractmethod
    def n_heads(self) -> int: ...

    @abstractmethod
    def base_layout(self) -> TokenLayout:
        """Layout at the default input size, without inserted tokens."""

    @abstractmethod
    def default_image_size(self) -> tuple[int, int]: ...

    @abstractmethod
    def grid_for(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """Patch grid for an input size; raises :class:`InputError` if the model can't take it."""

    def layout_for(self, image_size: tuple[int, int] | None) -> TokenLayout:
        layout = self.base_layout()
        if image_size is None:
            return layout
        return layout.with_grid(self.grid_for(image_size))

    @abstractmethod
    def input_module(self) -> nn.Module:
        """The module that first sees the image tensor (its pre-hook records the input size)."""

    def embed_module(self) -> nn.Module:
        """The module whose output is the bare patch embedding (no positions, no [CLS])."""
        return self.input_module()

    # hooks --------------------------------------------------------------------
    def sites(self) -> dict[str, Site]:
        """Canonical hook sites in forward order, built once (``hook_embed`` first)."""
        if self._sites is None:
            embed = self.embed_module()
            self._sites = {
                "hook_embed": EmbedSite(
                    "hook_embed", None, module=embed, channels_first=isinstance(embed, nn.Conv2d)
                ),
                **self.build_sites(),
            }
        return self._sites

    @abstractmethod
    def build_sites(self) -> dict[str, Site]: ...

    def attention_path(self) -> str:
        """One line on how attention patterns are obtained for this model."""
        return "native"

    # running ------------------------------------------------------------------
    @abstractmethod
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Final token sequence ``[B, N, C]`` (after the final norm), inserted tokens included
        unless :attr:`strips_extra`."""

    def forward(self, x: torch.Tensor) -> Any:
        """The source module's own forward (pooled output, logits or embedding)."""
        return self.module(x)

    def insert_tokens(self, k: int, values_fn: ValuesFn) -> Handle:
        """Insert ``k`` tokens right after the trained prefix where trained registers enter (before
        the pre-norm when the model has one, else before block 0); keep the bookkeeping."""
        raise UnsupportedModelError(
            f"{self.family} models cannot take extra tokens (their blocks assume exactly h*w "
            "tokens); test-time registers apply to plain ViTs only"
        )

    # preprocessing ------------------------------------------------------------
    def data_config(self) -> dict:
        """timm-style data config: input_size, mean, std, interpolation, crop_pct, crop_mode."""
        raise NotImplementedError

    def transform(self) -> Callable:
        """The eval preprocessing the source model expects, built from :meth:`data_config`."""
        from timm.data import create_transform

        return create_transform(**self.data_config(), is_training=False)

    # checks ---------------------------------------------------------------------
    def check_images(self, x: Any) -> None:
        """Raise a clear :class:`InputError` for inputs the source would choke on."""
        if not isinstance(x, torch.Tensor):
            raise InputError(
                f"expected an image tensor [B, 3, H, W], got {type(x).__name__}; "
                "preprocess PIL images with model.transform (or model.preprocess)"
            )
        if x.dim() != 4:
            raise InputError(
                f"expected an image batch [B, 3, H, W], got shape {tuple(x.shape)}; "
                "add a batch dimension with x.unsqueeze(0)"
            )
        if x.shape[1] != 3:
            raise InputError(
                f"expected 3 (RGB) channels, got {x.shape[1]} (shape {tuple(x.shape)}); convert "
                "images with PIL's img.convert('RGB') or repeat/drop channels before preprocessing"
            )
        if not torch.is_floating_point(x):
            raise InputError(
                f"expected a float image tensor, got {x.dtype}; preprocess with model.transform"
            )
        self.grid_for((int(x.shape[-2]), int(x.shape[-1])))


#: every adapter, tried highest priority first: those that check the module's own class (timm,
#: open_clip) before those that search a container for a tower (Hugging Face)
ADAPTERS: Registry[type[Adapter]] = Registry("adapters", modules=("vitreg.models.adapters",))
EXACT = 10  # the priority of an adapter that matches the module's own class
SEARCHING = 0  # the priority of one that looks inside the module for the network it wraps


def register_adapter(priority: int) -> Callable[[type[Adapter]], type[Adapter]]:
    """Class decorator adding an adapter to :data:`ADAPTERS` under its class name."""

    def deco(cls: type[Adapter]) -> type[Adapter]:
        ADAPTERS.register(cls.__name__, cls, priority=priority)
        return cls

    return deco


def adapter_for(module: nn.Module) -> Adapter:
    """Instantiate the adapter that handles ``module``, or raise :class:`UnsupportedModelError`."""
    for cls in ADAPTERS.values():
        if cls.matches(module):
            return cls(module)
    names = ", ".join(dict.fromkeys(c.family for c in ADAPTERS.values()))
    raise UnsupportedModelError(
        f"no vitreg adapter handles {type(module).__module__}.{type(module).__name__}; "
        f"supported families: {names}. Run `vitreg models` for example specs, or pass the "
        "vision tower itself (e.g. clip_model.visual, llava.vision_tower)"
    )
