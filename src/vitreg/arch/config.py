"""Variant options (:class:`VariantConfig`) and their checks against a model's depth and layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vitreg.errors import SpecError

COMPONENTS = ("norm", "ls", "qkv", "proj", "mlp")
BLOCK_WISE = ("qkv", "proj", "mlp")  # components with their own block selection
BlockSelection = str | int | Sequence[int] | None


@dataclass(frozen=True)
class VariantConfig:
    """Options of a [CLS]/patch-specialised ViT; ``None`` fields take the documented default.

    ``registers``: None keeps the base's own count. ``specialize``: components given a [CLS]-stream
    copy ("norm" = norm1+norm2 and "ls" = ls1+ls2 in every block; "qkv", "proj", "mlp" in the
    blocks of ``{qkv,proj,mlp}_blocks``: "first_third" (default, max(1, depth // 3) blocks),
    "all", N (the first N) or a list of indices). ``register_stream``: "cls" (default: registers
    join the global stream) or "patch". ``final_norm``: "shared" or "split". ``pool``: None keeps
    the base's pooling, "token" or "avg" (a name base built with ``pool="avg"`` drops the class
    token unless ``class_token=True`` is passed: the GAP baseline).
    """

    base: str | None = None
    registers: int | None = None
    specialize: tuple[str, ...] = ("norm", "ls", "qkv")
    qkv_blocks: BlockSelection = None
    proj_blocks: BlockSelection = None
    mlp_blocks: BlockSelection = None
    register_stream: str | None = None
    final_norm: str = "shared"
    attn_bias: bool = False
    pool: str | None = None
    timm_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        spec = self.specialize
        spec = (spec,) if isinstance(spec, str) else tuple(spec)
        object.__setattr__(self, "specialize", spec)
        bad = [c for c in spec if c not in COMPONENTS]
        if bad:
            raise SpecError(f"unknown component(s) {bad} in specialize; choose from {COMPONENTS}")
        for comp in BLOCK_WISE:
            if getattr(self, f"{comp}_blocks") is not None and comp not in spec:
                raise SpecError(
                    f"{comp}_blocks is set but {comp!r} is not in specialize={spec}; "
                    f"add {comp!r} to specialize or drop {comp}_blocks"
                )
        if self.registers is not None and (
            not isinstance(self.registers, int) or self.registers < 0
        ):
            raise SpecError(f"registers must be a count >= 0, got {self.registers!r}")
        _choice("register_stream", self.register_stream, ("cls", "patch", None))
        _choice("final_norm", self.final_norm, ("shared", "split"))
        _choice("pool", self.pool, ("token", "avg", None))
        if not isinstance(self.attn_bias, bool):
            raise SpecError(f"attn_bias must be True or False, got {self.attn_bias!r}")

    def blocks(self, component: str, depth: int) -> list[int]:
        """Indices of the blocks where ``component`` is specialised (sorted)."""
        if component not in self.specialize:
            return []
        if component not in BLOCK_WISE:
            return list(range(depth))
        return resolve_blocks(getattr(self, f"{component}_blocks"), depth, f"{component}_blocks")

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly fields."""
        out = asdict(self)
        out["specialize"] = list(self.specialize)
        return out

    def with_(self, **changes: Any) -> VariantConfig:
        """A copy with ``changes``."""
        return replace(self, **changes)


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise SpecError(f"{name} must be one of {allowed}, got {value!r}")


def resolve_blocks(sel: BlockSelection, depth: int, name: str) -> list[int]:
    """Block indices for a selection ("first_third", "all", N first blocks, or indices)."""
    if sel is None or sel == "first_third":
        return list(range(max(1, depth // 3)))
    if sel == "all":
        return list(range(depth))
    if isinstance(sel, str):
        raise SpecError(f"{name}={sel!r}: use 'first_third', 'all', a count or a list of indices")
    if isinstance(sel, int) and not isinstance(sel, bool):
        if not 0 <= sel <= depth:
            raise SpecError(f"{name}={sel} is beyond the model's depth {depth}; use 0..{depth}")
        return list(range(sel))
    out = set()
    for i in sel:
        if not isinstance(i, int) or not -depth <= i < depth:
            raise SpecError(
                f"{name} index {i!r} is beyond the model's depth {depth}; use 0..{depth - 1}"
            )
        out.add(i % depth)
    return sorted(out)
