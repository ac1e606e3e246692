"""Attention-probability sites that work with fused (SDPA) and unfused attention alike.

``native``: the source computes the probability tensor itself (unfused path) and a module sees it
(timm's ``attn_drop``); vitreg reads it there and may replace it. ``recomputed``: the source uses a
fused kernel, so vitreg captures q and k on their way in and recomputes ``softmax(q k^T * scale)``
exactly as the unfused path would; such patterns are read-only. Every result records which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import HookError
from vitreg.hooks.fused import answer_sdpa, can_attend
from vitreg.hooks.patterns import PatternReading, global_reading
from vitreg.hooks.sites import Handle, HookContext, HookFn, LayoutFn, Site, check_replacement
from vitreg.hooks.softmax import additive_mask as additive_mask
from vitreg.hooks.softmax import softmax_pattern as softmax_pattern
from vitreg.hooks.streamed import StreamedPattern, accepts_streamed, reads_columns, same_marks

NATIVE = "native"
RECOMPUTED = "recomputed"
ATTENTION_MODES = ("auto", "native", "recompute")
PatternValue = torch.Tensor | StreamedPattern


@dataclass
class PatternSite(Site):
    """``blocks.{i}.attn.hook_pattern``: probabilities ``[B, H, N_q, N_k]``.

    ``attn``: the attention module (its ``fused_attn`` flag is switched off while a native hook is
    attached and restored on removal). ``native_module``: the module whose output is the
    probability tensor on the unfused path. ``capture``: attaches hooks that compute the pattern
    on the fused path and pass it to a callback; it returns the torch handles.
    """

    attn: nn.Module | None = None
    native_module: nn.Module | None = None
    capture: Callable[[Callable[[PatternValue], None]], list[Any]] | None = None

    def resolve_source(self, mode: str) -> str:
        if mode not in ATTENTION_MODES:
            raise HookError(f"attention mode must be one of {ATTENTION_MODES}, got {mode!r}")
        fused = bool(getattr(self.attn, "fused_attn", False))
        if mode == "native" or (mode == "auto" and not fused) or self.capture is None:
            if self.native_module is None:
                raise HookError(f"{self.name!r}: this attention module exposes no native pattern")
            return NATIVE
        return RECOMPUTED

    def attn_source(self) -> str | None:
        return self.resolve_source("auto")

    def reading(self, layout: TokenLayout) -> PatternReading:
        """How analyses turn this site's probabilities into maps (global attention here)."""
        return global_reading(layout)

    def attach(self, fn: HookFn, get_layout: LayoutFn, attention: str = "auto") -> Handle:
        source = self.resolve_source(attention)
        name, layer, layout_fn = self.name, self.layer, self.layout_fn

        def ctx() -> HookContext:
            return HookContext(name, layer, layout_fn(get_layout()), source)

        handle = Handle()
        if source == NATIVE:
            if getattr(self.attn, "fused_attn", False):
                self.attn.fused_attn = False
                handle.add(lambda: setattr(self.attn, "fused_attn", True))

            def native_hook(_mod: nn.Module, _args: Any, output: torch.Tensor) -> Any:
                new = fn(output, ctx())
                return None if new is None else check_replacement(name, output, new)

            handle.add(self.native_module.register_forward_hook(native_hook).remove)
            return handle

        def on_pattern(pattern: torch.Tensor | StreamedPattern) -> None:
            if isinstance(pattern, StreamedPattern) and not accepts_streamed(fn):
                pattern = pattern.full()
            if fn(pattern, ctx()) is not None:
                raise HookError(
                    f"{name!r} was recomputed from q/k because the model uses fused attention, so "
                    "it cannot be edited; attach the hook with attention='native' to edit it"
                )

        for torch_handle in self.capture(same_marks(on_pattern, fn)):
            handle.add(torch_handle.remove)
        return handle


def capture_qk(
    attn: nn.Module,
    q_module: nn.Module,
    k_module: nn.Module,
    compute: Callable[[torch.Tensor, torch.Tensor, dict], PatternValue],
) -> Callable[[Callable[[PatternValue], None]], list[Any]]:
    """A ``PatternSite.capture`` that reads q from ``q_module`` and k from ``k_module`` outputs.

    ``compute(q_out, k_out, call_kwargs)`` turns the two outputs (and the kwargs the attention
    module was called with, e.g. rope or a mask) into the probabilities: a tensor, or a
    :class:`~vitreg.hooks.streamed.StreamedPattern` that hooks not taking one see in full.
    A streamed pattern whose column statistics the hooks read is delivered after the attention
    module ran, its statistics filled by the module's own SDPA call (:mod:`vitreg.hooks.fused`).
    """

    def capture(callback: Callable[[PatternValue], None]) -> list[Any]:
        state: dict[str, Any] = {}

        def on_call(_mod: nn.Module, _args: tuple, kwargs: dict) -> None:
            state.clear()
            state["kwargs"] = kwargs

        def on_q(_mod: nn.Module, _args: Any, out: torch.Tensor) -> None:
            state["q"] = out

        def on_k(_mod: nn.Module, _args: Any, out: torch.Tensor) -> None:
            q = state.pop("q")
            pattern = compute(q, out, state.get("kwargs", {}))
            if isinstance(pattern, StreamedPattern) and reads_columns(callback):
                if can_attend(pattern):  # computed once, with its statistics, by the SDPA call
                    state["restore"] = answer_sdpa(pattern)
                    state["pending"] = pattern
                    return
            callback(pattern)

        def on_done(_mod: nn.Module, _args: Any, out: Any) -> None:
            restore = state.pop("restore", None)
            if restore is not None:
                restore()
            pending = state.pop("pending", None)
            if pending is not None and out is not None:
                callback(pending)

        return [
            attn.register_forward_pre_hook(on_call, with_kwargs=True),
            q_module.register_forward_hook(on_q),
            k_module.register_forward_hook(on_k),
            attn.register_forward_hook(on_done, always_call=True),
        ]

    return capture
