"""Attention-bias substitute for test-time registers (Jiang et al. 2025, appendix).

Estimate, over a sample, the key and value that the test-time register presents to each head of
every layer; then drop the register: zero the register neurons and give every attention layer one
extra key/value slot holding those estimates. The slot is carried by an inserted placeholder
token whose key and value are overwritten in every layer, so it contributes exactly one fixed
key/value per head and nothing else (its own output is discarded like any inserted token).
"""

from __future__ import annotations

from typing import Any

import torch

from vitreg.errors import HookError
from vitreg.fix.base import Fix
from vitreg.fix.controls import ablate
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import Handle, HookContext
from vitreg.models.model import Model
from vitreg.results.fix import AttentionBiasDescription


def estimate_register_kv(
    model: Model,
    ttr: TestTimeRegisters,
    data: Any,
    batch_size: int = 32,
    limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean key and value ``[L, H, D]`` of the (first) test-time register over ``data``."""
    n = model.n_layers
    k_sum: list[torch.Tensor | None] = [None] * n
    v_sum: list[torch.Tensor | None] = [None] * n

    def grab(store: list, layer: int):
        def fn(t: torch.Tensor, hook: HookContext) -> None:
            reg = t[:, hook.layout.extra.start].double().sum(0).cpu()  # [H, D]
            store[layer] = reg if store[layer] is None else store[layer] + reg

        return fn

    hooks = []
    for i in range(n):
        hooks += [
            (hook_name(i, "attn.hook_k"), grab(k_sum, i)),
            (hook_name(i, "attn.hook_v"), grab(v_sum, i)),
        ]
    with ttr.applied(model), model.hooks(hooks):
        done = model.run_batches(data, batch_size, limit)
    if done == 0:
        raise HookError("no images to estimate the register's key and value from")
    return torch.stack(k_sum).float() / done, torch.stack(v_sum).float() / done


class AttentionBiasSubstitute(Fix):
    """Zeroed register neurons plus one fixed key/value slot per head and layer."""

    def __init__(self, neurons: NeuronSet, keys: torch.Tensor, values: torch.Tensor) -> None:
        if keys.shape != values.shape or keys.dim() != 3:
            raise HookError(
                f"keys/values must both be [layers, heads, head_dim], got {tuple(keys.shape)}"
            )
        self.neurons, self.keys, self.values = neurons, keys, values

    @classmethod
    def estimate(
        cls,
        model: Model,
        neurons: NeuronSet,
        data: Any,
        batch_size: int = 32,
        limit: int | None = None,
    ) -> AttentionBiasSubstitute:
        """Estimate the slot from the paper-mode test-time register over ``data``."""
        keys, values = estimate_register_kv(
            model, TestTimeRegisters(neurons), data, batch_size, limit
        )
        return cls(neurons, keys, values)

    def describe(self) -> AttentionBiasDescription:
        return AttentionBiasDescription(
            name=type(self).__name__,
            method="attention-bias",
            n_neurons=len(self.neurons),
            layers=int(self.keys.shape[0]),
            heads=int(self.keys.shape[1]),
        )

    def apply(self, model: Model) -> Handle:
        for name in (hook_name(0, "attn.hook_k"), hook_name(0, "attn.hook_v")):
            if not model.site(name).writable:
                raise HookError(
                    f"{model.family} models expose {name} read-only, so the attention-bias "
                    "substitute cannot set the extra key/value; use TestTimeRegisters instead"
                )
        if self.keys.shape[0] != model.n_layers:
            raise HookError(
                f"the slot was estimated for {self.keys.shape[0]} layers, model has {model.n_layers}"
            )

        def put(table: torch.Tensor, layer: int):
            def fn(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
                out = t.clone()
                out[:, hook.layout.extra.start] = table[layer].to(t)
                return out

            return fn

        handle = Handle()
        handle.add(model.insert_tokens(1).remove)
        try:
            hooks = []
            for i in range(model.n_layers):
                hooks += [
                    (hook_name(i, "attn.hook_k"), put(self.keys, i)),
                    (hook_name(i, "attn.hook_v"), put(self.values, i)),
                ]
            handle.add(model.hooks(hooks).remove)
            handle.add(ablate(model, self.neurons).remove)
        except Exception:
            handle.remove()
            raise
        return handle
