"""The text side of a CLIP whose vision tower vitreg wraps, kept reachable for zero-shot probes.

Loaders attach it to the wrapped vision module as a plain attribute (not a submodule), so the
tower's parameters, state dict, hooks and forward stay exactly as for vision-only use; the text
tower is built or loaded only when :meth:`TextTower.get` is first called (HF), or is the model
open_clip already built (open_clip). ``vitreg.models.text_tower.text_tower(model.module)`` reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

ATTRIBUTE = "vitreg_text_tower"


@dataclass
class TextTower:
    """How to reach a CLIP's text tower: ``source`` (``open_clip`` or ``hf``), a description and
    a builder that returns ``(full CLIP model, tokenizer)`` (called once, then kept)."""

    source: str
    name: str
    build: Callable[[], tuple[nn.Module, Any]]
    _built: tuple[nn.Module, Any] | None = field(default=None, repr=False)

    def get(self) -> tuple[nn.Module, Any]:
        """``(CLIP model, tokenizer)``; built on first use."""
        if self._built is None:
            self._built = self.build()
        return self._built


def attach(module: nn.Module, tower: TextTower) -> None:
    """Keep ``tower`` on the vision ``module`` without registering it as a submodule."""
    setattr(module, ATTRIBUTE, tower)  # not an nn.Module: a plain attribute


def text_tower(module: nn.Module) -> TextTower | None:
    """The text tower attached to a wrapped vision module, or None (vision-only source)."""
    return vars(module).get(ATTRIBUTE)
