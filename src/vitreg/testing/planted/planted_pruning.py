"""A planted ViT whose token-pruning curve is known (``planted:pruning``).

A one-block timm ViT on an 8 x 8 patch grid, weights set by hand:

* ``patch_embed`` writes each patch's mean R, G, B and their sum (brightness) into four channels;
  the position embedding writes a large value into a sink channel at ``N_SINKS`` fixed patch
  positions (position-persistent sinks, as SToP finds them across video frames).
* The block's LayerNorm gives every token the same query; the keys read the sink and brightness
  channels, so the [CLS] attention logit is ``SINK_LOGIT`` on a sink, ``OBJECT_LOGIT`` on a
  coloured object patch and 0 on black background. The attention output and the MLP write
  nothing, so every token's final feature is its own patch: sinks carry no class.

Its images (:func:`pruning_images`) are black, with ``N_OBJECTS`` patches painted in the class's
colour (red, green, blue) at random positions off the sinks. Keeping the top-k patches by [CLS]
attention (or received attention: every query is the same) keeps only sinks while
k <= ``N_SINKS``, and a probe on their mean is at chance; SToP's sink-aware score (mu 0.03,
gamma 1.1, a batch of images as its frames) ranks the objects first, so it holds at every
keep ratio. :class:`PruningTruth` says which (arm, ratio) keeps the class signal.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from vitreg.errors import SpecError
from vitreg.testing.planted.truth import TruthModel

GRID = 8  # patches per side
EMBED = 32
N_SINKS = 16
N_OBJECTS = 8
SINK_LOGIT = 2.5  # [CLS] attention logits: sink, object patch (background: 0)
OBJECT_LOGIT = 2.0
SINK_VALUE = 50.0  # position-embedding entry of a sink
CLS_VALUE = 1.0
COLOURS = ((255, 0, 0), (0, 255, 0), (0, 0, 255))  # class 0, 1, 2
R, G, B, BRIGHT, SINK, CLS, QUERY = range(7)  # residual channels
DESCRIPTION = (
    "one-block ViT, 8x8 patches: 16 fixed sink positions draw the [CLS] attention, class colour "
    "lives in 8 object patches; [CLS]-attention pruning keeps sinks, SToP's score keeps objects"
)


class PruningTruth(TruthModel):
    """Where the plant's sinks are and which pruning arm keeps the class signal at ``k``."""

    grid: tuple[int, int]
    sinks: list[int]  # row-major patch indices
    n_objects: int
    classes: int
    sink_logit: float
    object_logit: float

    def keeps_signal(self, arm: str, k: int) -> bool | None:
        """Whether the top-``k`` patches of ``arm`` include object patches (None: random)."""
        if arm in ("cls-attention", "received-attention"):
            return k > len(self.sinks)
        if arm == "sink-aware":
            return k >= 1
        return None


def sink_positions(seed: int) -> list[int]:
    """``N_SINKS`` patch positions drawn once per seed (row-major indices)."""
    g = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(GRID * GRID, generator=g)[:N_SINKS].tolist())


def build_pruning(img_size: int = 64, seed: int = 0) -> tuple[nn.Module, PruningTruth]:
    """The plant at ``img_size`` px (a multiple of 8) and its truth."""
    import timm

    if img_size % GRID:
        raise SpecError(f"planted:pruning needs img_size a multiple of {GRID}, got {img_size}")
    module = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=img_size,
        patch_size=img_size // GRID,
        embed_dim=EMBED,
        depth=1,
        num_heads=1,
        mlp_ratio=1.0,
        num_classes=0,
    )
    sinks = sink_positions(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
        _embed(module, sinks)
        _attention(module)
        module.norm.weight.fill_(1.0)
    truth = PruningTruth(
        grid=(GRID, GRID),
        sinks=sinks,
        n_objects=N_OBJECTS,
        classes=len(COLOURS),
        sink_logit=SINK_LOGIT,
        object_logit=OBJECT_LOGIT,
    )
    return module, truth


def _embed(module: nn.Module, sinks: list[int]) -> None:
    """Patch means of R, G, B and their sum in raw [0, 1] pixels; the sink and [CLS] marks."""
    from timm.data import resolve_model_data_config

    cfg = resolve_model_data_config(module)
    proj = module.patch_embed.proj
    area = proj.weight.shape[-1] * proj.weight.shape[-2]
    for c, (mean, std) in enumerate(zip(cfg["mean"], cfg["std"], strict=True)):
        for channel in (c, BRIGHT):  # undo the normalisation: raw = x * std + mean
            proj.weight[channel, c] = std / area
            proj.bias[channel] += mean
    # layout: timm's own position-embedding table (prefix rows first unless no_embed_class)
    offset = 0 if getattr(module, "no_embed_class", False) else module.num_prefix_tokens
    for i in sinks:
        module.pos_embed[0, offset + i, SINK] = SINK_VALUE
    module.cls_token[0, 0, CLS] = CLS_VALUE


def _attention(module: nn.Module) -> None:
    """One query for every token; keys that give sinks and objects their planted logits."""
    block = module.blocks[0]
    block.norm1.weight.fill_(1.0)
    block.norm1.weight[QUERY] = 0.0
    block.norm1.bias[QUERY] = 1.0  # every token's normalised QUERY channel is 1
    block.norm2.weight.fill_(1.0)
    qkv = block.attn.qkv.weight
    qkv[0, QUERY] = 1.0
    sink = torch.zeros(EMBED)
    sink[SINK] = SINK_VALUE
    obj = torch.zeros(EMBED)
    obj[R] = obj[BRIGHT] = 1.0
    read = block.norm1(torch.stack([sink, obj]))[:, [SINK, BRIGHT]]
    wanted = torch.tensor([SINK_LOGIT, OBJECT_LOGIT]) / block.attn.scale
    a, b = torch.linalg.solve(read, wanted).tolist()
    qkv[EMBED, SINK], qkv[EMBED, BRIGHT] = a, b


def pruning_images(
    n: int, split: str, img_size: int = 64, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` images of ``split`` (``uint8 [n, S, S, 3]``), their labels ``[n]`` and object
    patches ``bool [n, 64]``: black, ``N_OBJECTS`` patches off the sinks in the class colour."""
    if img_size % GRID:
        raise SpecError(f"the pruning images need a size that is a multiple of {GRID}")
    rng = np.random.default_rng([seed, {"train": 0, "val": 1}[split]])
    free = np.setdiff1d(np.arange(GRID * GRID), sink_positions(seed))
    p = img_size // GRID
    images = np.zeros((n, img_size, img_size, 3), np.uint8)
    labels = rng.integers(0, len(COLOURS), n)
    objects = np.zeros((n, GRID * GRID), bool)
    for i in range(n):
        for j in rng.choice(free, N_OBJECTS, replace=False):
            r, c = divmod(int(j), GRID)
            images[i, r * p : (r + 1) * p, c * p : (c + 1) * p] = COLOURS[labels[i]]
            objects[i, j] = True
    return images, labels, objects
