"""timm model names for the variants: ``timm.create_model("vitreg_vit_small_patch16_224", registers=4)``.

Each name builds its timm base with the variant keyword arguments of
:func:`~vitreg.arch.variant.create_variant` (``registers``, ``specialize``, ``qkv_blocks``,
``attn_bias``, ...) and any timm kwargs. The plain ``vit_*_patch16_224`` bases get LayerScale
(``init_values=1e-5``, overridable) so the default ``specialize=("norm", "ls", "qkv")`` applies;
build their baseline with ``specialize=()`` and the same ``init_values``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timm.models import register_model
from torch import nn

MODEL_NAMES: dict[str, tuple[str, dict[str, Any]]] = {
    "vitreg_vit_tiny_patch16_224": ("vit_tiny_patch16_224", {"init_values": 1e-5}),
    "vitreg_vit_small_patch16_224": ("vit_small_patch16_224", {"init_values": 1e-5}),
    "vitreg_vit_base_patch16_224": ("vit_base_patch16_224", {"init_values": 1e-5}),
    "vitreg_vit_small_patch14_dinov2": ("vit_small_patch14_dinov2", {}),
    "vitreg_vit_large_patch14_dinov2": ("vit_large_patch14_dinov2", {}),
    "vitreg_deit3_base_patch16_224": ("deit3_base_patch16_224", {}),
}


def _entrypoint(name: str, base: str, defaults: dict[str, Any]) -> Callable[..., nn.Module]:
    def entry(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        from vitreg.arch.variant import (
            create_variant,  # here: this module loads during `import timm`
        )

        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return create_variant(base, pretrained=pretrained, **{**defaults, **kwargs})

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = f"{base} as a vitreg variant (see vitreg.arch.create_variant)."
    return entry


for _name, (_base, _defaults) in MODEL_NAMES.items():
    register_model(_entrypoint(_name, _base, _defaults))
