"""Prompt and image -> LLaVA inputs: the prompt text, the token ids with one image placeholder
expanded to the image-token count, and the text positions whose attention is read."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitreg.errors import InputError
from vitreg.models.loaders.chat_template import render_chat_template
from vitreg.models.loaders.hf_vlm import VLM
from vitreg.models.model import Model

IMAGE = "<image>"
LLAVA_15 = "USER: <image>\n{prompt} ASSISTANT:"  # LLaVA-1.5's conversation format
QUERIES = ("answer", "last")


def prompt_text(vlm: VLM, prompt: str) -> str:
    """The full text the language model reads: ``prompt`` as given when it holds ``<image>``,
    else through the processor's chat template (rendered in vitreg's budgeted sandbox), else LLaVA-1.5's ``USER: <image>\\n... ASSISTANT:``."""
    if not prompt.strip():
        raise InputError("the prompt is empty; pass a question, e.g. --prompt 'What is shown?'")
    count = prompt.count(IMAGE)
    if count > 1:
        raise InputError(f"the prompt holds {count} {IMAGE} placeholders; vitreg takes one image")
    if count == 1:
        return prompt
    template = getattr(vlm.processor, "chat_template", None)
    if template:
        conversation = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}
        ]
        special = getattr(vlm.tokenizer, "special_tokens_map", None) or {}
        tokens = {k: v for k, v in special.items() if isinstance(v, str)}
        return render_chat_template(
            template,
            f"the chat template of {vlm.source or 'this VLM'}",
            **tokens,
            messages=conversation,
            add_generation_prompt=True,
        )
    return LLAVA_15.format(prompt=prompt)


def n_image_tokens(model: Model, vlm: VLM, image_size: tuple[int, int]) -> int:
    """How many image tokens LLaVA feeds the language model for an image of ``image_size``:
    the tower's tokens, less the first one under the "default" strategy."""
    n = model.adapter.layout_for(image_size).n_tokens
    return n - 1 if vlm.strategy == "default" else n


def token_ids(model: Model, vlm: VLM, text: str, image_size: tuple[int, int]) -> torch.Tensor:
    """``[1, T]`` token ids of ``text`` with its ``<image>`` expanded to the image-token count."""
    if vlm.tokenizer is None:
        raise InputError(
            f"{vlm.source or 'this VLM'} has no tokenizer (no processor was saved with it); "
            "wrap it with vitreg.vlm.wrap_vlm(module, processor) or save its processor in the folder"
        )
    n = n_image_tokens(model, vlm, image_size)
    image = vlm.tokenizer.convert_ids_to_tokens(vlm.image_token_id)
    ids = vlm.tokenizer(text.replace(IMAGE, image * n), return_tensors="pt")["input_ids"]
    found = int((ids == vlm.image_token_id).sum())
    if found != n:
        raise InputError(
            f"the tokenized prompt holds {found} image tokens, the image gives {n}; the "
            f"tokenizer does not keep {image!r} as one token"
        )
    return ids


def query_positions(
    query: str | Sequence[int], prompt_length: int, n_generated: int, length: int
) -> list[int]:
    """The text rows whose attention is read: "answer" -- the rows that generated each answer
    token (the last prompt token generated the first); "last" -- the last prompt token; or
    explicit positions in ``0..length-1``."""
    if isinstance(query, str):
        if query not in QUERIES:
            raise InputError(
                f"query must be one of {QUERIES} or a list of positions, got {query!r}"
            )
        if query == "last" or n_generated == 0:
            return [prompt_length - 1]
        return [prompt_length - 1 + j for j in range(n_generated)]
    positions = [int(p) for p in query]
    bad = [p for p in positions if not 0 <= p < length]
    if not positions or bad:
        raise InputError(
            f"query positions must be in 0..{length - 1} (the sequence has {length} tokens), "
            f"got {positions}"
        )
    return positions
