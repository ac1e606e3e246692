"""The fix family by name: ``ttr``, ``attention-bias``, ``ablate``, ``clearclip``, ``sclip``,
``naclip``, ``sc-clip``, ``rf-clip``, ``ov-stitcher``; ``a+b`` composes (neuron fixes first, then at most one last-block
method) and ``a,b`` lists entries for a leaderboard."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from vitreg.errors import InputError
from vitreg.fix.base import Fix
from vitreg.fix.clearclip import ClearCLIP
from vitreg.fix.naclip import NACLIP
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.ov_stitcher import OVStitcher
from vitreg.fix.rf_clip import RFCLIP
from vitreg.fix.sc_clip import SCCLIP
from vitreg.fix.sclip import SCLIP
from vitreg.hooks.sites import Handle
from vitreg.models.model import Model

NONE = "none"  # the unfixed model, the leaderboard's reference row


@dataclass
class FixInputs:
    """What building a fix may need: the model, register neurons, images to estimate from."""

    model: Model
    neurons: NeuronSet | None = None
    data: Any = None
    batch_size: int = 32
    ttr_options: dict[str, Any] = field(default_factory=dict)  # TestTimeRegisters keywords


@dataclass(frozen=True)
class FixMethod:
    """One registered method: ``build(inputs)`` returns its :class:`Fix`."""

    name: str
    summary: str
    build: Callable[[FixInputs], Fix]
    needs_neurons: bool = False
    last_block: bool = False
    needs_images: bool = False  # estimates something from ``FixInputs.data``


class FixRegistry(Mapping[str, FixMethod]):
    """Named fix methods (read like a dict); :meth:`register` adds one."""

    def __init__(self) -> None:
        self._items: dict[str, FixMethod] = {}

    def register(self, method: FixMethod) -> FixMethod:
        if method.name in self._items or method.name == NONE or "+" in method.name:
            raise InputError(f"fix method name {method.name!r} is taken or reserved")
        self._items[method.name] = method
        return method

    def __getitem__(self, name: str) -> FixMethod:
        if name not in self._items:
            raise InputError(f"unknown fix method {name!r}; choose from {', '.join(self)}")
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def parts(self, entry: str) -> list[FixMethod]:
        """The methods of one entry (``a+b``), checked to compose."""
        methods = [self[n.strip()] for n in entry.split("+")]
        names = [m.name for m in methods]
        if len(set(names)) != len(names):
            raise InputError(f"{entry!r} names a method twice")
        if sum(m.last_block for m in methods) > 1:
            raise InputError(
                f"{entry!r} combines last-block methods; each replaces the last block, so at "
                "most one can apply (compose it with a neuron fix such as ttr instead)"
            )
        if any(m.last_block for m in methods[:-1]):
            raise InputError(f"{entry!r}: put the last-block method last (it acts after the rest)")
        return methods

    def build(self, entry: str, inputs: FixInputs) -> Fix:
        """The fix of one entry: a method, or a composition of them."""
        from vitreg.fix.composed import ComposedFix

        methods = self.parts(entry)
        for m in methods:
            if m.needs_neurons and inputs.neurons is None:
                raise InputError(f"{m.name} edits register neurons; pass a neuron set")
        fixes = [m.build(inputs) for m in methods]
        return fixes[0] if len(fixes) == 1 else ComposedFix([m.name for m in methods], fixes)


def is_entry(text: str) -> bool:
    """Whether ``text`` names one entry by method names alone (``naclip``, ``ttr+naclip``);
    whether the parts compose is :meth:`FixRegistry.parts`'s to check."""
    parts = [p.strip() for p in text.split("+")]
    return all(p in FIXES for p in parts)


def parse_entries(text: str) -> list[str]:
    """``"ttr, naclip,ttr+naclip"`` -> ``["ttr", "naclip", "ttr+naclip"]`` (names checked)."""
    entries = [e.strip().replace(" ", "") for e in text.split(",") if e.strip()]
    if not entries:
        raise InputError(f"no fix method in {text!r}; choose from {', '.join(FIXES)}")
    for entry in entries:
        FIXES.parts(entry)
    return list(dict.fromkeys(entries))


class _Ablate(Fix):
    """Register neurons zeroed with no register to receive them (the paper's control)."""

    def __init__(self, neurons: NeuronSet) -> None:
        self.neurons = neurons

    def describe(self) -> dict[str, Any]:
        return {"method": "ablate", "n_neurons": len(self.neurons)}

    def apply(self, model: Model) -> Handle:
        from vitreg.fix.controls import ablate

        return ablate(model, self.neurons)


def _ttr(inputs: FixInputs) -> Fix:
    from vitreg.fix.test_time_registers import TestTimeRegisters

    return TestTimeRegisters(inputs.neurons, **inputs.ttr_options)


def _attention_bias(inputs: FixInputs) -> Fix:
    from vitreg.fix.attention_bias import AttentionBiasSubstitute

    if inputs.data is None:
        raise InputError("attention-bias estimates its key/value slot from images; pass data")
    return AttentionBiasSubstitute.estimate(
        inputs.model, inputs.neurons, inputs.data, inputs.batch_size
    )


FIXES = FixRegistry()
FIXES.register(
    FixMethod(
        "ttr",
        "test-time registers (Jiang et al. 2025): register neurons moved into an extra token",
        _ttr,
        needs_neurons=True,
    )
)
FIXES.register(
    FixMethod(
        "attention-bias",
        "the TTR appendix substitute: neurons zeroed plus one fixed key/value slot per head",
        _attention_bias,
        needs_neurons=True,
        needs_images=True,
    )
)
FIXES.register(
    FixMethod(
        "ablate",
        "register neurons zeroed with no register (the causal control, not a fix)",
        lambda inputs: _Ablate(inputs.neurons),
        needs_neurons=True,
    )
)
for _cls, _summary in (
    (ClearCLIP, "ClearCLIP: q-q attention, no residual/FFN"),
    (SCLIP, "SCLIP: q-q + k-k correlative attention"),
    (NACLIP, "NACLIP: Gaussian-neighbour k-k, no residual/FFN"),
):
    FIXES.register(FixMethod(_cls.name, _summary, lambda _i, c=_cls: c(), last_block=True))
FIXES.register(
    FixMethod(
        "sc-clip",
        "SC-CLIP: LOF token repair, similarity re-aggregation, multi-level fusion",
        lambda _inputs: SCCLIP(),
        last_block=True,
    )
)
FIXES.register(
    FixMethod(
        "rf-clip",
        "RF-CLIP: distraction tokens (over-activated channels) refocused in blocks 7-12",
        lambda _inputs: RFCLIP(),
        last_block=True,
    )
)
FIXES.register(
    FixMethod(
        "ov-stitcher",
        "OV-Stitcher: sliding-window crops stitched into one global final block",
        lambda _inputs: OVStitcher(),
        last_block=True,
    )
)
