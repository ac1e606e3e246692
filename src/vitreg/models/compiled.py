"""The compiled forward: ``torch.compile`` of a model's traced forward, with vitreg's hooks kept
out of the graphs.

Every forward (pre-)hook runs eagerly (``torch.compiler.disable``: a graph break at each hook),
so the compiled pieces are the source model's own code between hooks. An attention module that
carries a hook runs eagerly as a whole: the pattern capture may answer its fused attention call
with vitreg's own statistics (:mod:`vitreg.hooks.fused`), a swap made at run time that a traced
graph cannot follow. A frame that fails to compile runs eagerly instead, and is counted in the
:class:`CompileReport` with the reason; nothing of dynamo's reaches the caller's console.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitreg.errors import VitregError
from vitreg.hooks.sites import Handle

Backend = str | Callable[..., Any]
DEFAULT_BACKEND = "inductor"
_EAGER = "__vitreg_eager__"  # marks a hook or forward wrapped to run outside the graphs
#: the blocks share their forward's code, so each block whose hooks differ adds a variant of it
RECOMPILE_LIMIT = 64
_DYNAMO_LOG = "torch._dynamo.convert_frame"  # where dynamo says a frame fell back to eager


class CompileError(VitregError, RuntimeError):
    """``torch.compile`` cannot run here (unknown backend, no compiler for its kernels)."""


@dataclass
class CompileReport:
    """What the compiled path did: forwards run, graphs compiled, graph breaks, and the frames
    that fell back to eager (``fallbacks``, with ``reasons``)."""

    backend: str
    calls: int = 0
    graphs: int = 0
    graph_breaks: int = 0  # found while compiling (each counted once, not per forward)
    fallbacks: int = 0
    reasons: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0  # wall time of the forwards that compiled something

    def summary(self) -> str:
        """One line for the user."""
        text = (
            f"compiled forward ({self.backend}): {self.graphs} graphs, {self.graph_breaks} "
            f"graph breaks, {self.compile_seconds:.1f} s in the forwards that compiled"
        )
        if self.fallbacks:
            text += f"; {self.fallbacks} frames ran eagerly: " + "; ".join(self.reasons)
        return text


def check_backend(backend: Backend, device: torch.device) -> str:
    """The name of ``backend``, or a :class:`CompileError` saying why it cannot run on
    ``device`` (inductor needs a C++ compiler on a CPU and Triton on a GPU)."""
    if callable(backend):
        return getattr(backend, "__name__", type(backend).__name__)
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise CompileError(f"torch.compile has no backend {backend!r}; take one of {known}")
    if backend != "inductor":
        return backend
    if device.type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as e:  # torch raises its own error types for a missing compiler
            raise CompileError(
                f"inductor builds CPU kernels with a C++ compiler and found none ({e}); install "
                "g++ (or set CXX), or run without compiling"
            ) from None
    elif device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise CompileError("inductor needs Triton on a GPU; pip install triton")
    return backend


def _eager(fn: Callable[..., Any]) -> Callable[..., Any]:
    wrapped = torch.compiler.disable(fn, reason="vitreg hook: runs eagerly")
    setattr(wrapped, _EAGER, True)
    return wrapped


def _hook_dicts(module: nn.Module) -> list[dict[int, Callable[..., Any]]]:
    return [d for m in module.modules() for d in (m._forward_pre_hooks, m._forward_hooks)]


def eager_hooks(module: nn.Module) -> None:
    """Every forward (pre-)hook under ``module`` made to run outside the compiled graphs (each
    wrapped once: the same wrapper keeps the graphs' guards true from call to call)."""
    for hooks in _hook_dicts(module):
        for key, fn in list(hooks.items()):
            if not getattr(fn, _EAGER, False):
                hooks[key] = _eager(fn)


def plain_hooks(module: nn.Module) -> None:
    """The hooks under ``module`` as they were registered (undoes :func:`eager_hooks`)."""
    for hooks in _hook_dicts(module):
        for key, fn in list(hooks.items()):
            if getattr(fn, _EAGER, False):
                hooks[key] = fn.__wrapped__


def has_hooks(module: nn.Module) -> bool:
    """Whether a forward (pre-)hook sits on ``module`` or any module inside it."""
    return any(_hook_dicts(module))


class _Fallbacks(logging.Filter):
    """Takes dynamo's warnings that a frame runs eagerly (a compile error it suppressed, a
    recompile limit): counted and kept as reasons, never printed."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            exc = record.exc_info[1] if record.exc_info else None
            exc = getattr(exc, "inner_exception", None) or exc  # a backend's own error
            text = f"{type(exc).__name__}: {exc}" if exc is not None else record.getMessage()
            self.reasons.append(text.strip().splitlines()[0][:300])
        return False


class CompiledForward(Handle):
    """``features`` of ``module`` through ``torch.compile``; calling it runs one forward.

    ``eager``: the attention modules (pattern sites) that run eagerly while they carry a hook.
    ``remove()`` (or leaving a ``with`` block) puts the hooks back as registered and runs the
    removers :meth:`add` was given.
    """

    def __init__(
        self,
        module: nn.Module,
        features: Callable[[torch.Tensor], torch.Tensor],
        eager: list[nn.Module],
        backend: Backend = "inductor",
        mode: str | None = None,
    ) -> None:
        super().__init__()
        device = next(module.parameters()).device
        self.report = CompileReport(check_backend(backend, device))
        self.module = module
        self._eager = eager
        self._forwards: dict[int, Callable[..., Any] | None] = {}  # id -> the one replaced
        self._fn = torch.compile(features, backend=backend, mode=mode)

    def _eager_attention(self) -> None:
        """An attention module with a hook runs eagerly; without one it compiles."""
        for attn in self._eager:
            wanted, done = has_hooks(attn), id(attn) in self._forwards
            if wanted and not done:
                self._forwards[id(attn)] = attn.__dict__.get("forward")
                attn.forward = _eager(attn.forward)
            elif done and not wanted:
                self._put_back(attn)

    def _put_back(self, attn: nn.Module) -> None:
        before = self._forwards.pop(id(attn))
        if before is None:
            del attn.forward
        else:
            attn.forward = before

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch._dynamo
        from torch._dynamo.utils import counters

        eager_hooks(self.module)
        self._eager_attention()
        graphs = counters["stats"]["unique_graphs"]
        breaks = sum(counters["graph_break"].values())
        fallbacks, log = _Fallbacks(), logging.getLogger(_DYNAMO_LOG)
        log.addFilter(fallbacks)
        start = time.perf_counter()
        try:
            with torch._dynamo.config.patch(
                suppress_errors=True,
                skip_nnmodule_hook_guards=False,
                recompile_limit=RECOMPILE_LIMIT,
            ):
                out = self._fn(x)
        finally:
            log.removeFilter(fallbacks)
        new = counters["stats"]["unique_graphs"] - graphs
        report = self.report
        report.calls += 1
        report.graphs += new
        report.graph_breaks += sum(counters["graph_break"].values()) - breaks
        report.fallbacks += len(fallbacks.reasons)
        report.reasons += [r for r in dict.fromkeys(fallbacks.reasons) if r not in report.reasons]
        if new or fallbacks.reasons:
            report.compile_seconds += time.perf_counter() - start
        return out

    def remove(self) -> None:
        for attn in self._eager:
            if id(attn) in self._forwards:
                self._put_back(attn)
        plain_hooks(self.module)
        super().remove()
