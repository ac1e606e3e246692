"""Several fixes applied as one, in order (test-time registers first, then a last-block method),
removed in reverse; ``describe`` lists what each part is."""

from __future__ import annotations

from vitreg.errors import InputError
from vitreg.fix.base import Fix, named
from vitreg.hooks.sites import Handle
from vitreg.models.model import Model
from vitreg.results.fix import ComposedDescription


class ComposedFix(Fix):
    """``parts`` applied in order as one fix; ``names`` label them in reports."""

    def __init__(self, names: list[str], parts: list[Fix]) -> None:
        if len(names) != len(parts) or len(parts) < 2:
            raise InputError("a composed fix needs two or more named parts")
        self.names, self.parts = names, parts
        # the neuron set of the part that edits one (the feature cache keys on it)
        self.neurons = next((p.neurons for p in parts if hasattr(p, "neurons")), None)

    def describe(self) -> ComposedDescription:
        return ComposedDescription(
            name=type(self).__name__,
            method="+".join(self.names),
            parts=[named(p, n) for n, p in zip(self.names, self.parts, strict=True)],
        )

    def apply(self, model: Model) -> Handle:
        handle = Handle()
        try:
            for part in self.parts:
                handle.add(part.apply(model).remove)
        except Exception:
            handle.remove()
            raise
        return handle
