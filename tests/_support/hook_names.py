"""The pinned canonical hook-name list of plain ViTs (ARCHITECTURE.md), shared by adapter snapshots."""

PER_BLOCK = (
    "hook_resid_pre",
    "ln1.hook_in",
    "ln1.hook_out",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_pattern",
    "hook_resid_mid",
    "ln2.hook_out",
    "mlp.hook_post",
    "hook_resid_post",
)


def plain_vit_names(n_blocks: int) -> list[str]:
    """Every canonical name of a plain ViT with ``n_blocks`` blocks, in forward order."""
    blocks = [f"blocks.{i}.{n}" for i in range(n_blocks) for n in PER_BLOCK]
    return ["hook_embed", "hook_tokens", *blocks, "ln_final.hook_out"]
