"""The model families vitreg supports: example specs and the traps a user must know (data).

Used by ``vitreg models`` and the README. Facts come from reference/timm_internals.md (§3, §6, §7);
``adapter`` is the ``family`` attribute of the adapter that wraps the loaded module.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Family:
    """One supported family: where it comes from, how to name it, what to watch out for."""

    key: str
    name: str
    library: str  # import name of the library that builds the module
    adapter: str  # the adapter's ``family`` attribute
    examples: tuple[str, ...]
    notes: tuple[str, ...]
    extra: str | None = None  # pip extra that installs ``library`` (None: a core dependency)

    def to_dict(self) -> dict:
        return asdict(self)


FAMILIES: tuple[Family, ...] = (
    Family(
        "dinov2",
        "DINOv2 (+reg4)",
        "timm",
        "timm-vit",
        (
            "timm:vit_small_patch14_dinov2.lvd142m",
            "timm:vit_small_patch14_reg4_dinov2.lvd142m",
        ),
        (
            "Defaults to 518x518 inputs (37x37 patches) with a strict size check; pass "
            "img_size=224 or dynamic_img_size=True to vitreg.load for other sizes.",
            "reg4 models have 4 trained registers after [CLS], with no positional embedding.",
            "LayerScale (ls1/ls2). The giant model uses a packed SwiGLU MLP: mlp.hook_post is "
            "the gated product, not the SiLU gate.",
        ),
    ),
    Family(
        "dinov3",
        "DINOv3",
        "timm",
        "timm-eva",
        ("timm:vit_small_patch16_dinov3.lvd1689m",),
        (
            "timm Eva class: rope instead of absolute positions, 4 trained registers, LayerScale "
            "as bare gamma_1/gamma_2 parameters (no module to hook).",
            "Default 256 px, any multiple of 16 works; timm pools by average, upstream DINOv3 uses "
            "[CLS] (pass global_pool='token').",
            "S+/H+/7B use SwiGLU MLPs; *_qkvb variants add the qkv bias inside F.linear, "
            "bypassing hooks on attn.qkv.",
        ),
    ),
    Family(
        "clip",
        "CLIP in timm",
        "timm",
        "timm-vit",
        ("timm:vit_base_patch16_clip_quickgelu_224.openai",),
        (
            "Untagged CLIP names load fine-tuned ImageNet classifiers "
            "(e.g. .laion2b_ft_in12k_in1k); always name the tag (.openai, .laion2b, ...).",
            "OpenAI weights were trained with QuickGELU: use the *_clip_quickgelu_* names, the "
            "plain names build nn.GELU.",
            "Pre-norm (norm_pre = ln_pre), no LayerScale; the head is the CLIP projection. "
            "Mean/std differ per tag: use model.transform.",
        ),
    ),
    Family(
        "openclip",
        "OpenCLIP",
        "open_clip",
        "open_clip-vit",
        ("open_clip:ViT-B-16/laion2b_s34b_b88k",),
        (
            "Spec is ARCH/PRETRAINED_TAG as in open_clip.list_pretrained(); needs vitreg[openclip].",
            "open_clip calls nn.MultiheadAttention with need_weights=False: patterns come from "
            "q/k, see `vitreg inspect` for the path used.",
            "Towers built on a timm trunk (SigLIP, EVA-02 configs) are handled by the timm "
            "adapters of that trunk.",
        ),
        extra="openclip",
    ),
    Family(
        "siglip",
        "SigLIP",
        "timm",
        "timm-vit",
        ("timm:vit_base_patch16_siglip_224.webli",),
        (
            "No [CLS] token: the layout has no prefix, every token is a patch.",
            "Pools with a MAP head (attention-pool latent) whose attention is not a block hook; "
            "*_siglip_gap_* variants average instead.",
            "Mean/std 0.5.",
        ),
    ),
    Family(
        "deit3",
        "DeiT-III",
        "timm",
        "timm-vit",
        ("timm:deit3_small_patch16_224.fb_in1k",),
        (
            "Supervised ImageNet training; LayerScale (init 1e-6); [CLS] gets no positional "
            "embedding (no_embed_class).",
        ),
    ),
    Family(
        "dino",
        "DINO (v1)",
        "timm",
        "timm-vit",
        ("timm:vit_small_patch16_224.dino",),
        (
            "Plain ViT without LayerScale; the untagged name loads supervised augreg weights, "
            "not DINO: keep the .dino tag.",
        ),
    ),
    Family(
        "eva02",
        "EVA-02",
        "timm",
        "timm-eva",
        ("timm:eva02_base_patch14_224.mim_in22k",),
        (
            "timm Eva class: rope plus absolute positions, no LayerScale.",
            "T/S use a packed SwiGLU MLP; B/L use SwiGLU with a LayerNorm before fc2, so "
            "mlp.hook_post is the hidden unit before that norm.",
            "MIM models pool by average (fc_norm); mean/std are the OpenAI CLIP constants.",
        ),
    ),
    Family(
        "swin",
        "Swin Transformer",
        "timm",
        "timm-hier",
        ("timm:swin_tiny_patch4_window7_224.ms_in1k",),
        (
            "Hierarchical: no [CLS], 4 stages of NHWC token grids with their own layouts.",
            "Attention is windowed (49x49 per window, shifted on odd blocks), not global.",
            "Takes no extra tokens: test-time registers do not apply.",
        ),
    ),
    Family(
        "pvt_v2",
        "PVT-v2",
        "timm",
        "timm-hier",
        ("timm:pvt_v2_b0.in1k",),
        (
            "Hierarchical: no [CLS], 4 stages; spatial-reduction attention gives N x N_kv "
            "patterns.",
            "The MLP has a depthwise conv; neurons are read after its activation.",
            "Takes no extra tokens and no img_size argument (any size works).",
        ),
    ),
    Family(
        "hf-dinov2",
        "DINOv2 (HF)",
        "transformers",
        "hf-dinov2",
        ("hf:facebook/dinov2-with-registers-small", "hf:facebook/dinov2-small"),
        (
            "Needs vitreg[hf]. Positions are interpolated, so any multiple of the patch size works.",
            "The default sdpa attention returns no weights: patterns come from the eager path "
            "or from q/k, see `vitreg inspect`.",
            "HF heads pool by index ([CLS] or a mean over the rest): inserted tokens are "
            "stripped from features, but custom heads must skip them too.",
        ),
        extra="hf",
    ),
    Family(
        "hf-clip",
        "CLIP vision (HF)",
        "transformers",
        "hf-clip",
        ("hf:openai/clip-vit-large-patch14-336", "hf-vlm:llava-hf/llava-1.5-7b-hf"),
        (
            "Needs vitreg[hf]. The vision tower used by LLaVA-style VLMs, which read patch tokens "
            "of the penultimate layer.",
            "hf-vlm: loads a whole LLaVA model and wraps its tower (the VLM is model.vlm); "
            "`vitreg vlm` maps the language model's attention over the image before and after "
            "the fix.",
            "OpenAI towers use QuickGELU and a pre-layernorm (pre_layrnorm) before the blocks.",
        ),
        extra="hf",
    ),
    Family(
        "hf-siglip",
        "SigLIP vision (HF)",
        "transformers",
        "hf-siglip",
        ("hf:google/siglip-base-patch16-224",),
        (
            "Needs vitreg[hf]. No [CLS] token; post_layernorm covers all tokens and feeds the "
            "attention-pooling head.",
            "Inputs must have the configured size unless interpolate_pos_encoding=True is "
            "passed to vitreg.load. Random-weight builds need the config in the HF cache.",
        ),
        extra="hf",
    ),
    Family(
        "planted",
        "planted (synthetic)",
        "timm",
        "timm-vit",
        ("planted:dinov2_s14",),
        (
            "Synthetic: a real timm architecture with random weights and planted register "
            "neurons, with the ground truth. For offline demos and tests, not for claims about "
            "pretrained models.",
        ),
    ),
)


def get_family(key: str) -> Family:
    """The family named ``key``; ``KeyError`` lists the known keys."""
    for fam in FAMILIES:
        if fam.key == key:
            return fam
    raise KeyError(f"no family {key!r}; known: {[f.key for f in FAMILIES]}")


def status(fam: Family) -> str:
    """'ready', or what is missing here: the optional library, the loader or the adapter."""
    from vitreg.models.adapters.base import registered_adapters
    from vitreg.models.load import LOADERS, ensure_loaders

    ensure_loaders()

    if importlib.util.find_spec(fam.library) is None:
        return f"pip install 'vitreg[{fam.extra}]'" if fam.extra else f"needs {fam.library}"
    source = fam.examples[0].split(":", 1)[0]
    if source not in LOADERS:
        return f"no {source!r} loader yet"
    if fam.adapter not in {a.family for a in registered_adapters()}:
        return f"no {fam.adapter} adapter yet"
    return "ready"
