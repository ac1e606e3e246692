"""Test-time registers (Jiang et al. 2025, Algorithm 2): move register-neuron activations into
extra, untrained tokens at inference.

``paper`` mode, per image and per register neuron: the register takes the neuron's maximum over
all tokens, every other token's activation is zeroed ([CLS] too unless ``cls='keep'``).
``reference`` mode reproduces the official code's edit: one signed abs-max scalar over all
tokens ([CLS], registers and patches) and all of that layer's register neurons, with the
official tie rule (``|max| == |min|`` gives the min), patches zeroed, [CLS] kept -- applied to
every image of the batch (the official code only edits the first). The official discovery also
counts [CLS] among the outlier tokens: ``discover(..., include_prefix=True)`` reproduces that.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from vitreg.errors import InputError
from vitreg.fix.base import Fix
from vitreg.fix.neuron_set import NeuronSet
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import Handle, HookContext
from vitreg.models.model import Model
from vitreg.results.fix import FixSettings, TtrDescription
from vitreg.settings.ttr import TtrSettings

MODES = ("paper", "reference")
PATCH_STRATEGIES = ("zero", "mean", "keep")


def signed_abs_max(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """The entry of largest magnitude over ``dims``, with its sign (the official ``sign_max``:
    the max if ``|max| > |min|``, otherwise the min -- so a tie goes to the min)."""
    hi = x.amax(dim=dims)
    lo = x.amin(dim=dims)
    return torch.where(hi.abs() > lo.abs(), hi, lo)


class TestTimeRegisters(Fix):
    """Training-free registers: ``.apply(model)`` (removable handle) or ``with ttr.applied(model)``."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        neurons: NeuronSet,
        n_registers: int = 1,
        cls: str = "zero",
        patches: str = "zero",
        mode: str = "paper",
        seed: int = 0,
        scale: float = 1.0,
    ) -> None:
        if n_registers < 1:
            raise InputError(f"n_registers must be at least 1, got {n_registers}")
        if cls not in ("zero", "keep"):
            raise InputError(f"cls must be 'zero' or 'keep', got {cls!r}")
        if patches not in PATCH_STRATEGIES:
            raise InputError(f"patches must be one of {PATCH_STRATEGIES}, got {patches!r}")
        if mode not in MODES:
            raise InputError(f"mode must be one of {MODES}, got {mode!r}")
        self.neurons = neurons
        self.n_registers = n_registers
        self.cls = "keep" if mode == "reference" else cls
        self.patches = patches
        self.mode = mode
        self.seed = seed
        self.scale = scale
        self.assignment = self._assign()

    @classmethod
    def from_settings(
        cls, neurons: NeuronSet, settings: TtrSettings, seed: int = 0, scale: float = 1.0
    ) -> TestTimeRegisters:
        """The edit ``settings`` describe (registers, [CLS], patches, mode) on ``neurons``."""
        return cls(
            neurons,
            n_registers=settings.registers,
            cls=settings.cls,
            patches=settings.patches,
            mode=settings.mode,
            seed=seed,
            scale=scale,
        )

    def _assign(self) -> dict[tuple[int, int], int]:
        """Neuron -> register index, a seeded shuffle dealt round-robin (all to 0 with one register)."""
        pairs = self.neurons.pairs()
        order = list(range(len(pairs)))
        random.Random(self.seed).shuffle(order)
        return {pairs[i]: rank % self.n_registers for rank, i in enumerate(order)}

    def settings(self) -> FixSettings:
        """The edit: how many neurons in which blocks, registers, what [CLS] and patches get."""
        return FixSettings(
            n_neurons=len(self.neurons),
            layers=sorted(self.neurons.by_layer()),
            n_registers=self.n_registers,
            cls=self.cls,
            patches=self.patches,
            mode=self.mode,
            seed=self.seed,
            scale=self.scale,
        )

    def describe(self) -> TtrDescription:
        return TtrDescription(name=type(self).__name__, **dict(self.settings()))

    # the edit -----------------------------------------------------------------------------
    def _edit(self, layer: int, units: list[int]) -> Any:
        groups: dict[int, list[int]] = {}
        for u in units:
            groups.setdefault(self.assignment[(layer, u)], []).append(u)
        index = {r: torch.tensor(us) for r, us in groups.items()}

        def fn(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
            lay = hook.layout
            out = t.clone()
            for r, idx in index.items():
                idx = idx.to(t.device)
                acts = t[:, :, idx]  # [B, N, U]
                if self.mode == "reference":
                    value = signed_abs_max(acts, (1, 2))[:, None].expand(-1, len(idx))
                else:
                    value = acts.amax(dim=1)  # per image, per neuron: max over all tokens
                self._clear(out, acts, idx, lay)
                reg = lay.extra.start + r
                out[:, reg, idx] = value * self.scale
            return out

        return fn

    def _clear(self, out: torch.Tensor, acts: torch.Tensor, idx: torch.Tensor, lay) -> None:
        """Zero the neurons on every token but the registers, per the [CLS]/patch options."""
        p = lay.patches
        if self.patches == "zero":
            out[:, p, idx] = 0
        elif self.patches == "mean":
            out[:, p, idx] = acts[:, p].mean(1, keepdim=True).expand(-1, lay.n_patches, -1)
        for part in ("registers", "extra"):  # trained registers and other test-time registers
            sl = getattr(lay, part)
            out[:, sl, idx] = 0
        if self.cls == "zero":
            out[:, lay.cls, idx] = 0

    # applying -----------------------------------------------------------------------------
    def apply(self, model: Model) -> Handle:
        """Insert the registers and edit the neurons until the returned handle is removed.

        An empty neuron set is a no-op (no register is inserted), so outputs stay the bare model's.
        """
        self.neurons.check_fits(model)
        handle = Handle()
        if len(self.neurons) == 0:
            return handle
        handle.add(model.insert_tokens(self.n_registers).remove)
        try:
            hooks = [
                (hook_name(layer, "mlp.hook_post"), self._edit(layer, units))
                for layer, units in self.neurons.by_layer().items()
            ]
            handle.add(model.hooks(hooks).remove)
        except Exception:
            handle.remove()
            raise
        return handle
