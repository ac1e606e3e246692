"""Hook sites: a canonical name bound to the place in the source module where it is read or written.

A hook function has the TransformerLens signature ``fn(tensor, hook) -> tensor | None``: ``tensor``
is batch-first in vitreg's canonical shape, ``hook`` is a :class:`HookContext` (name, layer,
current :class:`TokenLayout`). Returning a tensor of the same shape replaces the value in the
forward pass; returning ``None`` leaves it untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

import torch
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import HookError


@dataclass
class HookContext:
    """What a hook function knows about where it runs."""

    name: str
    layer: int | None
    layout: TokenLayout | None
    attn_source: str | None = None


HookFn = Callable[[torch.Tensor, HookContext], "torch.Tensor | None"]
LayoutFn = Callable[[], "TokenLayout | None"]


class Handle:
    """Removes every torch hook (and undoes every attribute change) it owns; idempotent."""

    def __init__(self, removers: list[Callable[[], None]] | None = None) -> None:
        self._removers = list(removers or [])

    def add(self, remover: Callable[[], None]) -> None:
        self._removers.append(remover)

    def remove(self) -> None:
        while self._removers:
            self._removers.pop()()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def check_replacement(name: str, old: torch.Tensor, new: Any) -> torch.Tensor:
    """``new``, what a hook on ``name`` returned to replace ``old``; a clear error unless it is a
    tensor of the same shape."""
    if not isinstance(new, torch.Tensor):
        raise HookError(f"hook on {name!r} returned {type(new).__name__}; return a Tensor or None")
    if new.shape != old.shape:
        raise HookError(
            f"hook on {name!r} returned shape {tuple(new.shape)}; it must keep {tuple(old.shape)}"
        )
    return new


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass
class Site:
    """Base class: a named read/write point. Subclasses attach torch hooks."""

    name: str
    layer: int | None
    layout_fn: Callable[[TokenLayout | None], TokenLayout | None] = field(
        default=_identity, repr=False
    )
    writable: bool = True

    def context(self, get_layout: LayoutFn) -> HookContext:
        return HookContext(self.name, self.layer, self.layout_fn(get_layout()), self.attn_source())

    def attn_source(self) -> str | None:
        return None

    def attach(self, fn: HookFn, get_layout: LayoutFn, attention: str = "auto") -> Handle:
        """Register ``fn`` here; ``attention`` only matters for attention-pattern sites."""
        raise NotImplementedError


@dataclass
class OutputSite(Site):
    """The output of ``module`` (forward hook). ``to_canon``/``from_canon`` convert layouts."""

    module: nn.Module | None = None
    to_canon: Callable[[Any], torch.Tensor] = _identity
    from_canon: Callable[[torch.Tensor, Any], Any] = field(default=lambda new, old: new)

    def attach(self, fn: HookFn, get_layout: LayoutFn, attention: str = "auto") -> Handle:
        site = self

        def hook(_mod: nn.Module, _args: Any, output: Any) -> Any:
            value = site.to_canon(output)
            new = fn(value, site.context(get_layout))
            if new is None:
                return None
            if not site.writable:
                raise HookError(f"{site.name!r} is read-only; its hook must return None")
            return site.from_canon(check_replacement(site.name, value, new), output)

        return Handle([self.module.register_forward_hook(hook).remove])


@dataclass
class InputSite(Site):
    """The first positional input of ``module`` (forward pre-hook)."""

    module: nn.Module | None = None
    kwarg: str | None = None  # name of the input when the caller may pass it by keyword
    to_canon: Callable[[Any], torch.Tensor] = _identity
    from_canon: Callable[[torch.Tensor, Any], Any] = field(default=lambda new, old: new)
    prepend: bool = False

    def attach(self, fn: HookFn, get_layout: LayoutFn, attention: str = "auto") -> Handle:
        site = self

        def hook(_mod: nn.Module, args: tuple, kwargs: dict) -> Any:
            by_kw = not args and site.kwarg is not None and site.kwarg in kwargs
            raw = kwargs[site.kwarg] if by_kw else args[0]
            value = site.to_canon(raw)
            new = fn(value, site.context(get_layout))
            if new is None:
                return None
            if not site.writable:
                raise HookError(f"{site.name!r} is read-only; its hook must return None")
            replaced = site.from_canon(check_replacement(site.name, value, new), raw)
            if by_kw:
                return args, {**kwargs, site.kwarg: replaced}
            return (replaced, *args[1:]), kwargs

        handle = self.module.register_forward_pre_hook(hook, with_kwargs=True, prepend=self.prepend)
        return Handle([handle.remove])


def bhnd_to_bnhd(t: torch.Tensor) -> torch.Tensor:
    """Attention heads tensors ``[B, H, N, D]`` to vitreg's canonical ``[B, N, H, D]``."""
    return t.transpose(1, 2)


def bnhd_to_bhnd(new: torch.Tensor, _old: Any) -> torch.Tensor:
    return new.transpose(1, 2)


@dataclass
class EmbedSite(Site):
    """``hook_embed``: the patch embedding as a grid ``[B, h, w, C]``, before positions and [CLS].

    ``module`` outputs ``[B, N, C]`` (laid out with the layout's grid), an NHWC grid, or, when
    ``channels_first``, a conv's ``[B, C, h, w]``; tuples are read at their first item. A
    returned grid is written back in the module's own format.
    """

    module: nn.Module | None = None
    channels_first: bool = False

    def to_grid(self, out: Any, layout: TokenLayout | None) -> torch.Tensor:
        t = out[0] if isinstance(out, tuple) else out
        if t.dim() == 4:
            return t.permute(0, 2, 3, 1) if self.channels_first else t
        if layout is None or t.shape[1] != layout.n_patches:
            raise HookError(f"hook_embed: cannot lay {tuple(t.shape)} out on the patch grid")
        return t.reshape(t.shape[0], *layout.grid, t.shape[-1])

    def from_grid(self, grid: torch.Tensor, out: Any) -> Any:
        t = out[0] if isinstance(out, tuple) else out
        if t.dim() == 4:
            new = grid.permute(0, 3, 1, 2) if self.channels_first else grid
        else:
            new = grid.reshape(t.shape)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    def attach(self, fn: HookFn, get_layout: LayoutFn, attention: str = "auto") -> Handle:
        site = self

        def hook(_mod: nn.Module, _args: Any, output: Any) -> Any:
            grid = site.to_grid(output, get_layout())
            layout = TokenLayout(0, 0, (grid.shape[1], grid.shape[2]), (1, 1))
            new = fn(grid, HookContext(site.name, None, layout))
            if new is None:
                return None
            return site.from_grid(check_replacement(site.name, grid, new), output)

        return Handle([self.module.register_forward_hook(hook).remove])
