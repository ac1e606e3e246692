"""What a variant costs: extra parameters per component, and FLOPs against its shared baseline.

The baseline is the same ViT with shared modules, no attention-bias slot and no registers, so
``extra["registers"]`` is the register tokens' parameters. Specialisation adds parameters only:
each token passes through one copy, so FLOPs equal the baseline's; registers add tokens and the
attention-bias slot adds one key column per layer (both reported by :func:`flop_report`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitreg.arch.attention import BiasAttention
from vitreg.arch.config import VariantConfig
from vitreg.arch.split import TokenSplit
from vitreg.arch.variant import build, merge_streams
from vitreg.core.renamed import renamed
from vitreg.results.experiment import FlopCounts, FlopDeltas, ParamCounts

PARTS = ("norm", "ls", "qkv", "proj", "mlp", "final_norm", "attn_bias", "registers")


def param_lines(report: ParamCounts) -> list[str]:
    """One line per component with a nonzero cost, then the total."""
    out = [
        f"{p:<11} +{report.extra[p]:>12,d}  ({report.percent[p]:.3f}%)"
        for p in PARTS
        if report.extra[p]
    ]
    pct = 100 * report.extra_total / report.baseline
    return [
        *out,
        f"{'total':<11} +{report.extra_total:>12,d}  ({pct:.3f}%) of {report.baseline:,d}",
    ]


def param_report(model: nn.Module | VariantConfig) -> ParamCounts:
    """Extra parameters per component of a variant over its shared baseline, absolute and in
    percent (a :class:`VariantConfig` is built on meta)."""
    if isinstance(model, VariantConfig):
        with torch.device("meta"):
            model = build(model)
    extra = dict.fromkeys(PARTS, 0)
    for m in model.modules():
        if isinstance(m, TokenSplit):
            extra[m.component] += _count(m.glob)
        elif isinstance(m, BiasAttention):
            extra["attn_bias"] += m.k_bias.numel() + m.v_bias.numel()
    reg = getattr(model, "reg_token", None)
    if reg is not None:
        pos_rows = 0 if model.no_embed_class or model.pos_embed is None else reg.shape[1]
        extra["registers"] = reg.numel() + pos_rows * model.embed_dim
    total = _count(model)
    baseline = total - sum(extra.values())
    percent = {p: 100 * n / baseline for p, n in extra.items()}
    return ParamCounts(
        total=total,
        baseline=baseline,
        extra=extra,
        percent=percent,
        extra_total=total - baseline,
    )


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def count_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of ``model(x)`` with attention on the matmul path (SDPA's CPU kernel is not counted)."""
    fused = [(m, m.fused_attn) for m in model.modules() if hasattr(m, "fused_attn")]
    try:
        for m, _ in fused:
            m.fused_attn = False
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        for m, flag in fused:
            m.fused_attn = flag
    return int(counter.get_total_flops())


def flop_report(model: nn.Module, batch: int = 1) -> FlopCounts:
    """FLOPs of a variant's forward at its image size against the shared model, by cause.

    ``flops_shared`` is the same model with merged streams and no slot (same tokens).
    ``specialisation`` is the variant minus the same model with merged streams (expected 0);
    ``attn_bias`` the slot's extra key column; ``registers`` what the register tokens cost in the
    blocks (the merged model's blocks on ``N`` versus ``N - R`` tokens).
    """
    p = next(model.parameters())
    size = tuple(model.patch_embed.img_size)
    x = torch.zeros(batch, 3, *size, device=p.device, dtype=p.dtype)
    merged = merge_streams(model)
    bias_only = merge_streams(model)
    _restore_bias(bias_only, model)
    flops = count_flops(model, x)
    shared = count_flops(merged, x)
    with_bias = count_flops(bias_only, x)
    n_reg, n_tok = int(model.num_reg_tokens), int(model.patch_embed.num_patches)
    # layout: a bare timm model (no vitreg Model yet): its own prefix count
    n_tok += int(model.num_prefix_tokens)
    blocks = merged.blocks
    t = torch.zeros(batch, n_tok, model.embed_dim, device=p.device, dtype=p.dtype)
    # layout: FLOPs depend on the token count only: n_reg fewer tokens
    registers = count_flops(blocks, t) - count_flops(blocks, t[:, n_reg:]) if n_reg else 0
    return FlopCounts(
        image_size=list(size),
        tokens=n_tok,
        registers=n_reg,
        flops=flops,
        flops_shared=shared,
        delta=FlopDeltas(
            specialisation=flops - with_bias, attn_bias=with_bias - shared, registers=registers
        ),
    )


def _restore_bias(merged: nn.Module, variant: nn.Module) -> None:
    """Give ``merged`` the variant's attention-bias slots back (streams stay merged)."""
    for blk_m, blk_v in zip(merged.blocks, variant.blocks, strict=True):
        if isinstance(blk_v.attn, BiasAttention):
            new = BiasAttention.from_attention(blk_m.attn)
            with torch.no_grad():
                new.k_bias.copy_(blk_v.attn.k_bias)
                new.v_bias.copy_(blk_v.attn.v_bias)


__getattr__ = renamed(__name__, {"ParamReport": "ParamCounts"}, globals())
