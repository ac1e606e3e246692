"""A tiny LLaVA built offline: the planted HF CLIP tower (``hf_clip_t16``), a random projector and a
random 2-layer Llama, with a word-level tokenizer and a ``LlavaProcessor`` -- no download.

``save_tiny_llava(folder)`` writes it with ``save_pretrained`` (safetensors) plus its processor,
so ``vitreg.load("hf-vlm:FOLDER")`` goes through the same code as a downloaded LLaVA-1.5. The
language model is untrained: its answers are word salad; the tower's outliers are real (planted).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitreg.testing.planted.catalog import build
from vitreg.testing.planted.truth import GroundTruth

TOWER = "hf_clip_t16"
IMAGE_TOKEN = "<image>"
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", IMAGE_TOKEN)
WORDS = (
    "USER ASSISTANT : ? . , a an the is are of in on with and what which where how many color "
    "image photo picture shows there this that it sky grass water tree trees road car cat dog "
    "person people red green blue white black yellow flat texture left right top bottom center "
    "background large small one two three yes no describe see"
).split()
PLANTED_FILE = "vitreg_planted.json"  # the marker vitreg.models.loaders.hf_vlm reads


def tiny_tokenizer() -> Any:
    """A word-level fast tokenizer over :data:`WORDS` (lower and upper case kept as written)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate((*SPECIALS, *WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )


def build_tiny_llava(img_size: int = 112, seed: int = 0) -> tuple[nn.Module, Any, GroundTruth]:
    """``(LlavaForConditionalGeneration, LlavaProcessor, tower ground truth)``, eager attention."""
    from transformers import (
        CLIPImageProcessor,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tower, truth = build(TOWER, img_size=img_size, seed=seed)
    tokenizer = tiny_tokenizer()
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        initializer_range=0.2,  # peaked next-token distributions: answers depend on the image
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaConfig(
        vision_config=tower.config,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=(img_size // 16) ** 2,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    vlm = LlavaForConditionalGeneration(config).eval()
    vlm.model.vision_tower.load_state_dict(tower.state_dict())
    vlm.model.vision_tower.vitreg_weights = "planted"  # vitreg.wrap(vlm) says it is synthetic
    vlm.generation_config.pad_token_id = tokenizer.pad_token_id
    vlm.generation_config.eos_token_id = tokenizer.eos_token_id
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": img_size},
        crop_size={"height": img_size, "width": img_size},
        image_mean=list(truth.mean),
        image_std=list(truth.std),
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=16,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    return vlm, processor, truth


def save_tiny_llava(folder: str | Path, img_size: int = 112, seed: int = 0) -> Path:
    """Write the tiny LLaVA to ``folder`` (load it as ``hf-vlm:FOLDER``); returns the folder."""
    out = Path(folder)
    vlm, processor, truth = build_tiny_llava(img_size, seed)
    vlm.save_pretrained(out)
    processor.save_pretrained(out)
    info = {
        "description": f"planted {TOWER} tower at {img_size} px, 2-layer Llama of width 32, "
        f"seed {seed}",
        "tower": TOWER,
        "ground_truth": truth.model_dump(mode="json"),
    }
    (out / PLANTED_FILE).write_text(json.dumps(info, indent=1))
    return out
