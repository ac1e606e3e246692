"""Build [CLS]/patch-specialised timm ViTs: ``create_variant`` (from a name or a model), ``convert``.

The result is a real timm ``VisionTransformer`` (forward_features, forward_head,
forward_intermediates, num_prefix_tokens and pretrained_cfg all work) whose specialised modules
are :class:`~vitreg.arch.split.TokenSplit` wrappers and whose attention, with ``attn_bias``, is
:class:`~vitreg.arch.attention.BiasAttention`. The resolved options are ``model.variant_config``.
Converting copies every shared tensor into both streams, so without ``attn_bias`` the converted
model computes its source's function exactly; the attention-bias slot is a new N(0, 0.02)
parameter (even a zero key takes softmax mass), so with it the outputs differ.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from vitreg.arch.attention import BiasAttention
from vitreg.arch.config import BlockSelection, VariantConfig
from vitreg.arch.split import TokenSplit, split
from vitreg.core.layout import TokenLayout
from vitreg.errors import SpecError, UnsupportedModelError


def create_variant(
    base: str | nn.Module,
    registers: int | None = None,
    specialize: str | tuple[str, ...] = ("norm", "ls", "qkv"),
    qkv_blocks: BlockSelection = None,
    register_stream: str | None = None,
    final_norm: str = "shared",
    attn_bias: bool = False,
    pool: str | None = None,
    proj_blocks: BlockSelection = None,
    mlp_blocks: BlockSelection = None,
    pretrained: bool = False,
    **timm_kwargs: Any,
) -> nn.Module:
    """A specialised timm ViT from a timm model name (built here) or a ViT instance (converted).

    See :class:`~vitreg.arch.config.VariantConfig` for the options; ``timm_kwargs`` (e.g.
    ``img_size``, ``depth``, ``init_values``) go to ``timm.create_model`` and need a name base.
    """
    cfg = VariantConfig(
        base=base if isinstance(base, str) else None,
        registers=registers,
        specialize=specialize,
        qkv_blocks=qkv_blocks,
        proj_blocks=proj_blocks,
        mlp_blocks=mlp_blocks,
        register_stream=register_stream,
        final_norm=final_norm,
        attn_bias=attn_bias,
        pool=pool,
        timm_kwargs=dict(timm_kwargs),
    )
    if isinstance(base, str):
        return build(cfg, pretrained)
    if timm_kwargs or pretrained:
        raise SpecError(
            "timm keyword arguments and pretrained=True only apply when base is a timm model "
            f"name; got a {type(base).__name__} instance with {sorted(timm_kwargs) or 'pretrained'}"
        )
    return convert(base, cfg)


def build(cfg: VariantConfig, pretrained: bool = False) -> nn.Module:
    """Build ``cfg.base`` with timm (registers/pooling passed through) and specialise it."""
    import timm

    kwargs = dict(cfg.timm_kwargs)
    if cfg.registers is not None:
        kwargs["reg_tokens"] = cfg.registers
    if cfg.pool is not None:
        kwargs["global_pool"] = cfg.pool
        if cfg.pool == "avg":
            kwargs.setdefault("class_token", False)
    if kwargs.get("global_pool") == "token" and kwargs.get("class_token") is False:
        raise SpecError(
            "pool='token' reads the [CLS] token; keep the class token or use pool='avg'"
        )
    try:
        model = timm.create_model(cfg.base, pretrained=pretrained, **kwargs)
    except RuntimeError as err:
        if "Unknown model" not in str(err):
            raise
        raise SpecError(f"{err}; list names with timm.list_models('vit_*')") from err
    return apply(model, cfg.with_(registers=None, pool=None))


def convert(model: nn.Module, cfg: VariantConfig | None = None, **options: Any) -> nn.Module:
    """A specialised copy of a timm ViT instance; both stream copies start as clones.

    ``options`` are :class:`VariantConfig` fields (or pass ``cfg``). The source is not changed.
    """
    cfg = cfg or VariantConfig(**options)
    check_model(model)
    if cfg.registers is not None and cfg.registers != int(model.num_reg_tokens):
        raise SpecError(
            f"conversion keeps the source's {model.num_reg_tokens} register(s), registers="
            f"{cfg.registers} was asked; build from a timm name to change the count"
        )
    if cfg.pool is not None and cfg.pool != model.global_pool:
        raise SpecError(
            f"conversion keeps the source's pooling {model.global_pool!r}, pool={cfg.pool!r} was "
            "asked; call model.reset_classifier(num_classes, global_pool=...) first"
        )
    return apply(copy.deepcopy(model), cfg.with_(registers=None, pool=None))


def check_model(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` unless ``model`` is a timm ViT with ``Block`` blocks."""
    from timm.models.vision_transformer import Block, VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise UnsupportedModelError(
            f"vitreg.arch specialises timm VisionTransformer models (ViT, DeiT-III, DINOv2, "
            f"CLIP, SigLIP); got {type(model).__name__}"
        )
    odd = {type(b).__name__ for b in model.blocks if type(b) is not Block}
    if odd:
        raise UnsupportedModelError(f"vitreg.arch needs timm Block blocks, found {sorted(odd)}")
    if any(isinstance(m, TokenSplit | BiasAttention) for m in model.modules()):
        raise SpecError("this model is already a vitreg variant; convert the original model")


def global_tokens(model: nn.Module, register_stream: str | None) -> int:
    """Tokens in the global stream: [CLS] plus the registers when they join its stream."""
    n_cls = 1 if getattr(model, "cls_token", None) is not None else 0
    layout = TokenLayout(n_cls, int(model.num_reg_tokens), (1, 1), (1, 1))
    return layout.prefix.stop if register_stream != "patch" else layout.cls.stop


def apply(model: nn.Module, cfg: VariantConfig) -> nn.Module:
    """Specialise ``model`` in place as ``cfg`` says; store the resolved config on it."""
    check_model(model)
    depth, n_reg = len(model.blocks), int(model.num_reg_tokens)
    if cfg.register_stream is not None and n_reg == 0:
        raise SpecError(
            f"register_stream={cfg.register_stream!r} needs registers; pass registers=R (> 0) "
            "or drop register_stream"
        )
    n_global = global_tokens(model, cfg.register_stream)
    if (cfg.specialize or cfg.final_norm == "split") and n_global == 0:
        raise SpecError(
            "specialisation splits the [CLS] stream from the patches, but this model has no "
            "class token (pool='avg' builds the GAP baseline without one) and no registers in "
            "the global stream; pass specialize=() and final_norm='shared', class_token=True, "
            "or registers with register_stream='cls'"
        )
    if "ls" in cfg.specialize and not all(hasattr(b.ls1, "gamma") for b in model.blocks):
        raise SpecError(
            "'ls' specialises LayerScale but this model has none (ls1/ls2 are Identity); build "
            "it with init_values=1e-5 (a timm kwarg) or drop 'ls' from specialize"
        )
    if cfg.final_norm == "split" and not any(True for _ in model.norm.parameters()):
        raise SpecError(
            "final_norm='split' needs a final norm, but model.norm has no parameters (avg pooling "
            "uses fc_norm instead); pass fc_norm=False or final_norm='shared'"
        )
    plan = {c: cfg.blocks(c, depth) for c in cfg.specialize}
    for i, blk in enumerate(model.blocks):
        if i in plan.get("norm", ()):
            blk.norm1, blk.norm2 = (
                split(blk.norm1, n_global, "norm"),
                split(blk.norm2, n_global, "norm"),
            )
        if i in plan.get("ls", ()):
            blk.ls1, blk.ls2 = split(blk.ls1, n_global, "ls"), split(blk.ls2, n_global, "ls")
        if i in plan.get("qkv", ()):
            blk.attn.qkv = split(blk.attn.qkv, n_global, "qkv")
        if i in plan.get("proj", ()):
            blk.attn.proj = split(blk.attn.proj, n_global, "proj")
        if i in plan.get("mlp", ()):
            _split_mlp(blk.mlp, n_global)
        if cfg.attn_bias:
            blk.attn = BiasAttention.from_attention(blk.attn)
    if cfg.final_norm == "split":
        model.norm = split(model.norm, n_global, "final_norm")
    stream = cfg.register_stream or ("cls" if n_reg else None)
    model.variant_config = cfg.with_(
        registers=n_reg,
        register_stream=stream,
        pool=model.global_pool,
        qkv_blocks=plan.get("qkv"),
        proj_blocks=plan.get("proj"),
        mlp_blocks=plan.get("mlp"),
    )
    return model


def _split_mlp(mlp: nn.Module, n_global: int) -> None:
    """Split every parametrised child of the MLP (fc1, fc2, ...): per token, the same as two MLPs.

    The parameter-free children (act, drop1 = vitreg's ``mlp.hook_post``) stay shared modules.
    """
    for name, child in list(mlp.named_children()):
        if any(True for _ in child.parameters()):
            setattr(mlp, name, split(child, n_global, "mlp"))


def merge_streams(model: nn.Module) -> nn.Module:
    """A copy of a variant with shared modules (the patch-stream copies) and no attention bias."""
    out = copy.deepcopy(model)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, TokenSplit):
                setattr(parent, name, child.patch)
            elif isinstance(child, BiasAttention):
                child.to_attention()
    out.__dict__.pop("variant_config", None)
    return out
