"""The two towers of a CLIP as zero-shot needs them: image embeddings through the wrapped vision
tower (so a fix applied to it is seen), text embeddings and the logit scale from the text tower
the loader kept (:mod:`vitreg.models.text_tower`), for open_clip and Hugging Face CLIP."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vitreg.errors import InputError
from vitreg.fix.neuron_set import weights_fingerprint
from vitreg.models.model import Model
from vitreg.models.text_tower import text_tower
from vitreg.progress import Update

TEXT_BATCH = 256  # prompts per text-tower forward
MAX_PROMPTS = 2_000_000  # ImageNet-21k's classes with OpenAI's 80 templates stay below


@dataclass
class ClipTowers:
    """``images(x)`` -> image embeddings ``[B, D]``; ``texts(prompts)`` -> text embeddings
    ``[n, D]`` (both unnormalised); ``logit_scale`` = CLIP's learned ``logit_scale.exp()``;
    ``weights`` a fingerprint of the CLIP's weights."""

    name: str
    images: Callable[[Tensor], Tensor]
    texts: Callable[[list[str]], Tensor]
    logit_scale: float
    weights: str


def clip_towers(model: Model) -> ClipTowers:
    """The CLIP behind ``model``, or an :class:`InputError` saying which models have one."""
    tower = text_tower(model.module)
    if tower is None:
        name = model.spec or type(model.module).__name__
        why = (
            "open_clip towers on a timm trunk are unwrapped to the trunk, without projection "
            "or text tower"
            if (model.spec or "").startswith("open_clip:")
            else "timm models and other vision-only towers keep no text side"
        )
        raise InputError(
            f"zero-shot needs a CLIP text tower and {name} ({model.family}) has none: {why}. "
            "Load a CLIP ViT through open_clip (e.g. open_clip:ViT-B-16-quickgelu/openai) or "
            "Hugging Face (e.g. hf:openai/clip-vit-base-patch16), which keep the text tower"
        )
    clip, tokenizer = tower.get()
    device = model.device
    clip.to(device)
    if tower.source == "open_clip":
        return _open_clip(tower.name, clip, tokenizer, device)
    return _hf(tower.name, clip, tokenizer, model, device)


def _open_clip(name: str, clip: torch.nn.Module, tokenizer, device: torch.device) -> ClipTowers:
    """open_clip: its own ``encode_image`` (``clip.visual`` is the wrapped tower) and
    ``encode_text``."""

    def images(x: Tensor) -> Tensor:
        return clip.encode_image(x)

    def texts(prompts: list[str]) -> Tensor:
        return clip.encode_text(tokenizer(prompts).to(device))

    scale = clip.logit_scale.exp().item()
    return ClipTowers(f"open_clip:{name}", images, texts, scale, weights_fingerprint(clip))


def _hf(name: str, clip: torch.nn.Module, tokenizer, model: Model, device) -> ClipTowers:
    """transformers ``CLIPModel``: the wrapped ``CLIPVisionModel``'s pooled output through
    ``visual_projection``; ``text_model`` pooled output through ``text_projection``."""

    length = clip.config.text_config.max_position_embeddings  # the text tower's context

    def images(x: Tensor) -> Tensor:
        return clip.visual_projection(model(x).pooler_output)

    def texts(prompts: list[str]) -> Tensor:
        batch = tokenizer(
            prompts, padding=True, truncation=True, max_length=length, return_tensors="pt"
        ).to(device)
        out = clip.text_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return clip.text_projection(out.pooler_output)

    scale = clip.logit_scale.exp().item()
    return ClipTowers(f"hf:{name}", images, texts, scale, weights_fingerprint(clip))


@torch.no_grad()
def class_embeddings(
    towers: ClipTowers, names: list[str], templates: list[str], progress: Update | None = None
) -> Tensor:
    """One unit vector per class: the mean of its L2-normalised prompt embeddings (one prompt
    per template), normalised again (CLIP's prompt ensembling), ``[K, D]`` float32;
    ``progress(n)`` gets the prompts embedded so far. At most :data:`MAX_PROMPTS` prompts."""
    if len(names) * len(templates) > MAX_PROMPTS:
        raise InputError(
            f"{len(names):,} classes × {len(templates):,} templates make "
            f"{len(names) * len(templates):,} prompts, above the {MAX_PROMPTS:,} vitreg runs "
            "through the text tower; use fewer templates"
        )
    prompts = [t.format(n) for n in names for t in templates]
    chunks = []
    for i in range(0, len(prompts), TEXT_BATCH):
        chunks.append(F.normalize(towers.texts(prompts[i : i + TEXT_BATCH]).float(), dim=-1))
        if progress is not None:
            progress(min(len(prompts), i + TEXT_BATCH))
    per_prompt = torch.cat(chunks).reshape(len(names), len(templates), -1)
    return F.normalize(per_prompt.mean(1), dim=-1).cpu()


def zero_shot_logits(images: Tensor, classes: Tensor, logit_scale: float) -> Tensor:
    """``logit_scale`` × cosine similarity of each image embedding to each class embedding."""
    return (
        logit_scale * F.normalize(images.float(), dim=-1) @ F.normalize(classes.float(), dim=-1).T
    )
