"""``hf-vlm:ORG/NAME`` or ``hf-vlm:DIR``: a transformers LLaVA model (``LlavaForConditionalGeneration``,
LLaVA-1.5 layout: a CLIP or SigLIP vision tower, a projector, a language model).

``vitreg.load`` returns the vision tower as a :class:`Model` (hooks, diagnose, neurons and fixes
work on it, and act inside the VLM, which calls the same module); ``model.vlm`` is the
:class:`VLM` holding the whole model, its tokenizer and processor. The language model runs eager
attention (``attn_implementation='eager'``) so that its attention weights exist; weights load in
the checkpoint's own dtype (fp16 for LLaVA-1.5; ``vitreg.load(..., dtype=...)`` casts them).
LLaVA reads the tower's ``hidden_states[vision_feature_layer]``; with test-time registers
inserted, the tower strips them from every hidden state it returns, so the projector sees the
same image tokens.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from vitreg.core.readers import read_json
from vitreg.errors import InputError, SpecError, UnsupportedModelError, WeightsError
from vitreg.models.adapters.hf import first_attr
from vitreg.models.load import Loaded, offline_hint
from vitreg.models.loaders.hf_source import ProcessorTransform, hub_or_folder
from vitreg.models.loaders.vlm_folder import MODEL_TYPES, check_vlm_folder, no_safetensors
from vitreg.models.model import Model

SPEC_EXAMPLE = "hf-vlm:llava-hf/llava-1.5-7b-hf"
LAYOUT = "this VLM layout"
PLANTED_FILE = "vitreg_planted.json"  # written by vitreg.testing.planted.save_tiny_llava


@dataclass
class VLM:
    """A LLaVA model, its tokenizer/processor, and the facts vitreg needs about its image tokens."""

    module: nn.Module
    tokenizer: Any | None = None
    processor: Any | None = None
    source: str | None = None

    @property
    def config(self) -> Any:
        return self.module.config

    @property
    def tower(self) -> nn.Module:
        """The vision tower module (the one the wrapped :class:`Model` hooks)."""
        return first_attr(self.module, "model.vision_tower", "vision_tower", unsupported=LAYOUT)

    @property
    def projector(self) -> nn.Module:
        """The multimodal projector (tower features -> language-model input)."""
        return first_attr(
            self.module, "model.multi_modal_projector", "multi_modal_projector", unsupported=LAYOUT
        )

    @property
    def lm_layers(self) -> list[nn.Module]:
        """The language model's decoder layers."""
        return list(
            first_attr(
                self.module,
                "model.language_model.layers",
                "language_model.model.layers",
                unsupported=LAYOUT,
            )
        )

    @property
    def image_token_id(self) -> int:
        found = getattr(self.config, "image_token_id", None)
        return int(found if found is not None else self.config.image_token_index)

    @property
    def feature_layer(self) -> int:
        """``vision_feature_layer``: the index into the tower's ``hidden_states`` LLaVA reads."""
        layer = self.config.vision_feature_layer
        if not isinstance(layer, int):
            raise UnsupportedModelError(
                f"vision_feature_layer={layer} (several layers concatenated) is not supported; "
                "vitreg maps one feature layer's tokens to the image tokens"
            )
        return layer

    @property
    def strategy(self) -> str:
        """``vision_feature_select_strategy``: "default" drops the first token ([CLS]), "full" keeps it."""
        return str(self.config.vision_feature_select_strategy)

    @property
    def lm_attention(self) -> str:
        return str(getattr(self.config.text_config, "_attn_implementation", None))


def check_vlm(module: nn.Module) -> None:
    """A clear error unless ``module`` is a supported LLaVA model."""
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    if model_type not in MODEL_TYPES:
        raise SpecError(
            f"{type(module).__name__} (model_type {model_type!r}) is not a supported VLM; "
            f"hf-vlm covers {list(MODEL_TYPES)} (LlavaForConditionalGeneration, LLaVA-1.5 layout)"
        )


def wrap_vlm(
    module: nn.Module,
    processor: Any | None = None,
    tokenizer: Any | None = None,
    spec: str | None = None,
    transform: Callable | None = None,
) -> Model:
    """Wrap a loaded ``LlavaForConditionalGeneration``: its vision tower as a :class:`Model`,
    with ``model.vlm`` holding the whole VLM (``tokenizer`` defaults to the processor's, the
    image transform to its image processor)."""
    check_vlm(module)
    vlm = VLM(module, tokenizer or getattr(processor, "tokenizer", None), processor, spec)
    image_processor = getattr(processor, "image_processor", None)
    if transform is None and image_processor is not None:
        transform = ProcessorTransform(image_processor)
    model = Model(vlm.tower, spec=spec, transform=transform)
    model.vlm = vlm
    return model


def _planted_note(source: str, is_local: bool) -> list[str]:
    """The synthetic-model note of a folder written by ``save_tiny_llava`` (else none)."""
    path = Path(source) / PLANTED_FILE
    if not is_local or not path.is_file():
        return []
    info = read_json(path, "VLM file", max_bytes=2**20)
    if not isinstance(info, dict):
        return []
    return [
        f"synthetic: a tiny LLaVA with random weights ({info.get('description', '')}); its tower "
        f"is the planted fixture {info.get('tower')}. Not a trained model: use it to test tools"
    ]


def _processor(source: str) -> Any | None:
    """The model's own processor from the folder or the cache, else ``None``."""
    try:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(source, local_files_only=True)
    except Exception:  # no processor saved: prompts then need a tokenizer passed in
        return None


def load_hf_vlm(
    name: str, pretrained: bool = True, weights: str | os.PathLike | None = None, **kwargs: Any
) -> Loaded:
    """Load a LLaVA model (see the module docstring); its tower is what ``vitreg.load`` wraps."""
    try:
        from transformers import AutoConfig, LlavaForConditionalGeneration
    except ImportError as e:
        raise SpecError("hf-vlm: models need transformers; pip install 'vitreg[hf]'") from e
    if weights is not None:
        raise SpecError(
            "hf-vlm: loads a whole saved VLM (a folder written by save_pretrained, or a hub id); "
            "a single weights file is not enough"
        )
    attn = kwargs.pop("attn_implementation", "eager")
    if kwargs:
        raise SpecError(f"hf-vlm: takes only attn_implementation, got {sorted(kwargs)}")
    try:
        source, is_local = hub_or_folder(name)
    except SpecError:
        raise SpecError(
            f"{name!r} is neither a local directory nor a hub id ORG/NAME; e.g. "
            f"{SPEC_EXAMPLE} or hf-vlm:./my_saved_llava"
        ) from None
    if is_local:  # checked before transformers reads anything in it
        check_vlm_folder(Path(source))
    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as e:
        where = f"directory {source!r}" if is_local else f"hub id {source!r}"
        raise WeightsError(offline_hint(where, e)) from e
    if config.model_type not in MODEL_TYPES:
        raise SpecError(
            f"{source!r} is a {config.model_type!r} model; hf-vlm covers {list(MODEL_TYPES)}"
        )
    try:
        if pretrained:
            module = LlavaForConditionalGeneration.from_pretrained(
                source, config=config, attn_implementation=attn, use_safetensors=True, dtype="auto"
            )
        else:
            module = LlavaForConditionalGeneration._from_config(config, attn_implementation=attn)
    except (RuntimeError, ValueError) as e:  # e.g. a projector of another size
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise WeightsError(
            f"the weights of {source!r} do not fit the model its config.json describes ({first}); "
            "re-save the folder with save_pretrained"
        ) from None
    except OSError as e:
        if is_local:
            raise no_safetensors(Path(source)) from None
        raise WeightsError(offline_hint(f"the weights of {source!r}", e)) from e
    processor = _processor(source)
    notes = _planted_note(source, is_local) if pretrained else []
    check_vlm(module)
    vlm = VLM(module, getattr(processor, "tokenizer", None), processor, f"hf-vlm:{name}")
    image_processor = getattr(processor, "image_processor", None)

    def setup(model: Model) -> None:
        module.to(device=model.device, dtype=model.dtype).eval()
        model.vlm = vlm

    return Loaded(
        vlm.tower,
        transform=ProcessorTransform(image_processor) if image_processor is not None else None,
        notes=notes,
        setup=setup,
        weights=("planted" if notes else "user" if is_local else "trained") if pretrained else None,
    )


def vlm_of(model: Model) -> VLM:
    """``model.vlm``, or a clear error for a model that is not a VLM's tower."""
    vlm = getattr(model, "vlm", None)
    if not isinstance(vlm, VLM):
        raise InputError(
            f"{model.spec or type(model.module).__name__} is not a VLM's vision tower; load one "
            "with vitreg.load('hf-vlm:llava-hf/llava-1.5-7b-hf') or wrap a loaded "
            "LlavaForConditionalGeneration with vitreg.vlm.wrap_vlm(module, processor)"
        )
    return vlm
