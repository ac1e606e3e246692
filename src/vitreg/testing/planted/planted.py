"""Planted-artifact ViTs: real timm architectures, seeded random weights, planted register neurons.

No pretrained weights can be downloaded where vitreg is built and tested, so detection, neuron
discovery and fixes are tested against these fixtures. ``build(name)`` returns the source timm
module and its :class:`GroundTruth`. The plant is made by editing weights only (no hooks, no
extra modules), so the module saves and loads as a plain timm checkpoint.

The planted mechanism mimics trained register neurons (Darcet et al. 2024; Jiang et al. 2025):

* ``patch_embed`` gets ``K`` zero-mean high-frequency filters (texture channels); flat patches
  give exactly zero there.
* block 0's MLP sums ``|filter response|`` against a constant reference channel into an energy
  channel (both divided by the same LayerNorm scale, so its sign does not depend on the rest of
  the token); block 1's MLP turns that sign into a bounded "flat" flag with a sharp ramp. The
  model's decision matches :meth:`GroundTruth.outlier_mask` to within ~3% of the threshold.
* ``n`` units of the first planted layer fire only where the flag is set and write a large
  vector; from that layer on the selected patches have residual norms of tens of times the
  median patch norm. Units of the next layer read that direction and reinforce it (outlier norms
  grow with depth), and later layers' keys make the outliers attention sinks.

A reserved zero channel is read alongside every reserved channel, which cancels LayerNorm's mean
and makes the flat/textured decision independent of the rest of the token. Random writes into
the reserved channels are removed up to the first planted layer.

:class:`GroundTruth` gives each unit a role: causal units (the first planted layer), readers
(the next one) and, in the fixtures of :mod:`.planted_circuits` (``groups`` in
their specs), causes spread over several blocks, strong downstream readers and distractors.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vitreg.errors import SpecError
from vitreg.testing.planted._weights import (
    FLAG,
    FLAG_T,
    N_FILTERS,
    NORM_RATIO,
    THRESHOLD,
    Group,
    PlantPlan,
    Scales,
    Spec,
    create,
    onehot,
    plant_flag,
    plant_sinks,
    random_init,
    reserve,
    set_unit,
    token_layout,
)
from vitreg.testing.planted.planted_circuits import build_circuit
from vitreg.testing.planted.truth import FlatRule, GroundTruth

SPECS: dict[str, Spec] = {
    "dinov2_s14": Spec(
        "vit_small_patch14_dinov2",
        "DINOv2 ViT-S/14 (LayerScale), register neurons in layers 6-7 fire on flat patches",
        (6, 7),
        (3, 2),
    ),
    "dinov2_s14_reg4": Spec(
        "vit_small_patch14_reg4_dinov2",
        "DINOv2 ViT-S/14 with 4 register tokens (outliers still land on patches); layers 6-7",
        (6, 7),
        (3, 2),
    ),
    "dinov2_s14_swiglu": Spec(
        "vit_giant_patch14_dinov2",
        "DINOv2-g block design (SwiGLUPacked MLP, SiLU) at ViT-S/14 width; neurons in layers 5-6",
        (5, 6),
        (3, 2),
        dict(embed_dim=384, depth=12, num_heads=6),
    ),
    "clip_b16": Spec(
        "vit_base_patch16_clip_quickgelu_224",
        "OpenAI CLIP ViT-B/16 tower (norm_pre, QuickGELU); neurons in layers 6-7",
        (6, 7),
        (4, 2),
    ),
    "clip_t16": Spec(
        "vit_base_patch16_clip_quickgelu_224",
        "CLIP ViT/16 tower at tiny width (192, 3 heads, 10 blocks; norm_pre, QuickGELU); "
        "neurons in layers 6-7 (the timm twin of hf_clip_t16)",
        (6, 7),
        (4, 2),
        dict(embed_dim=192, num_heads=3, depth=10),
    ),
    "deit3_s16": Spec(
        "deit3_small_patch16_224",
        "DeiT-III ViT-S/16 (LayerScale, no pos-embed on [CLS]); neurons in layers 5-6",
        (5, 6),
        (3, 2),
    ),
    "dinov2_s14_early": Spec(
        "vit_small_patch14_dinov2",
        "DINOv2 ViT-S/14: 3 register neurons in block 2 create 20x outliers on flat patches; "
        "readers in blocks 5 and 8 reinforce them",
        (),
        (),
        groups=(
            Group("cause", 2, 3, "flag", "v", 20.0, 60.0),
            Group("reader", 5, 1, "v", "v", 0.15, 150.0),
            Group("reader", 8, 1, "v", "v", 0.15, 150.0),
        ),
    ),
    "dinov2_s14_multiblock": Spec(
        "vit_small_patch14_dinov2",
        "DINOv2 ViT-S/14: weak register neurons in blocks 2-3 (flat patches at 2.5x the median, "
        "no outlier mode) and strong ones in block 4 add up to 25x outliers; strong readers in "
        "blocks 6-9; texture and [CLS] distractors",
        (),
        (),
        groups=(
            Group("texture", 2, 1, "flag", "random", 0.25, 30.0),
            Group("cause", 2, 2, "flag", "v", 2.0, 25.0, equal=True),
            Group("cls", 3, 1, "ref", "random", 0.3, 300.0),
            Group("cause", 3, 2, "flag", "v", 2.5, 25.0, equal=True),
            Group("texture", 4, 1, "flag", "random", 0.25, 30.0),
            Group("cls", 4, 1, "ref", "random", 0.3, 300.0),
            Group("cause", 4, 2, "flag/v", "v", 25.0, 40.0),
            *(Group("reader", layer, 1, "v", "v", 0.1, 150.0) for layer in (6, 7, 8, 9)),
        ),
    ),
}


def _spec(name: str) -> Spec:
    if name not in SPECS:
        raise SpecError(f"unknown planted model {name!r}; known: {sorted(SPECS)}")
    return SPECS[name]


def _plan(module: nn.Module, spec: Spec, g: torch.Generator) -> PlantPlan:
    d = module.embed_dim
    hidden = module.blocks[0].mlp.fc2.in_features
    chans = torch.randperm(d, generator=g)[: 4 + N_FILTERS].tolist()
    counts = {
        0: 2 * N_FILTERS + 2,
        1: 2,
        spec.layers[0]: spec.n_units[0],
        spec.layers[1]: spec.n_units[1],
    }
    units = {
        layer: sorted(torch.randperm(hidden, generator=g)[:n].tolist())
        for layer, n in counts.items()
    }
    v = torch.randn(d, generator=g)
    v = v - v.mean()
    return PlantPlan(*chans[:4], chans[4:], units, v / v.norm())


class _Stop(Exception):
    """Ends the calibration forward after the first planted layer."""


def _calibrate(module: nn.Module, plan: PlantPlan, spec: Spec, img_size: int) -> Scales:
    """Measure LayerNorm scales and the median patch norm on a few synthetic images."""
    from vitreg.testing.images import synthetic_images

    cfg = module.pretrained_cfg
    mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    x = (synthetic_images(4, img_size, seed=12345) - mean) / std
    patches = token_layout(module).patches
    first = spec.layers[0]
    blocks = module.blocks
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def grab(i: int):
        def hook(_m: nn.Module, args: tuple) -> None:
            t = args[0][:, patches].float()
            centred = t - t.mean(-1, keepdim=True)
            inv = (centred.pow(2).mean(-1, keepdim=True) + blocks[i].norm2.eps).rsqrt()
            seen[i] = (centred * inv, inv[..., 0])

        return hook

    def stop(_m: nn.Module, _a: tuple, out: torch.Tensor) -> None:
        seen[-1] = (out[:, patches].float().norm(dim=-1), out)
        raise _Stop

    handles = [blocks[i].norm2.register_forward_pre_hook(grab(i)) for i in (0, 1, first)]
    handles.append(blocks[first].register_forward_hook(stop))
    try:
        module.forward_features(x)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    hat0 = seen[0][0]
    return Scales(
        s0=(hat0[..., plan.ref] - hat0[..., plan.zero]).median().item(),
        s1=seen[1][1].median().item(),
        s_plant=seen[first][1].median().item(),
        median_norm=seen[-1][0].median().item(),
    )


def _plant(
    module: nn.Module, plan: PlantPlan, spec: Spec, sc: Scales, g: torch.Generator
) -> list[tuple[int, int, str]]:
    """Write the texture-energy, flat-flag, register-neuron and attention-sink weights."""
    helpers = plant_flag(module, plan, sc)
    d = module.embed_dim
    blocks = module.blocks
    z = plan.zero
    first, second = spec.layers
    # first planted layer: act_j = a_j (flag - t); their writes sum to NORM_RATIO x median norm
    amps = 25 + 15 * torch.rand(len(plan.units[first]), generator=g)
    reads = [onehot(d, (plan.flag, a), (z, -a)) for a in amps.tolist()]
    total = NORM_RATIO * sc.median_norm
    _write_units(
        blocks[first],
        plan.units[first],
        reads,
        -amps * FLAG_T,
        amps * (FLAG - FLAG_T),
        plan.direction,
        total,
        g,
    )
    # second planted layer: reads the written direction after LayerNorm; outliers grow by half
    norm = blocks[second].norm2
    v = plan.direction
    amps2 = 6 + 3 * torch.rand(len(plan.units[second]), generator=g)
    t2 = 0.4 * math.sqrt(d)
    offset = float((v * norm.bias / norm.weight).sum())
    reads = [a * v / norm.weight for a in amps2.tolist()]
    acts2 = amps2 * (0.95 * math.sqrt(d) - t2)
    _write_units(
        blocks[second], plan.units[second], reads, -amps2 * (t2 + offset), acts2, v, total / 2, g
    )
    plant_sinks(module, v, range(first + 1, len(blocks)), g)
    return helpers


def _write_units(
    blk: nn.Module,
    units: list[int],
    reads: list[torch.Tensor],
    biases: torch.Tensor,
    acts: torch.Tensor,
    direction: torch.Tensor,
    total: float,
    g: torch.Generator,
) -> None:
    """Units read ``reads[i]`` and write near ``direction``; expected summed write has norm ``total``."""
    d = direction.numel()
    noise = torch.randn(len(units), d, generator=g)
    noise = noise - noise.mean(dim=1, keepdim=True)
    dirs = direction + 0.25 * noise / noise.norm(dim=1, keepdim=True)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    weights = 0.7 + 0.6 * torch.rand(len(units), generator=g)
    scale = total / (acts[:, None] * weights[:, None] * dirs).sum(0).norm()
    gamma = blk.ls2.gamma.detach() if hasattr(blk.ls2, "gamma") else torch.ones(d)
    for i, j in enumerate(units):
        set_unit(blk.mlp, j, reads[i], float(biases[i]), scale * weights[i] * dirs[i] / gamma)


def build_timm(name: str, img_size: int = 224, seed: int = 0) -> tuple[nn.Module, GroundTruth]:
    """The timm fixture ``name`` of :data:`SPECS` (role-annotated ones through
    :func:`~vitreg.testing.planted.planted_circuits.build_circuit`) and its ground truth."""
    spec = _spec(name)
    if spec.groups:
        return build_circuit(name, spec, img_size, seed)
    module = create(spec, img_size)
    patch = int(module.patch_embed.patch_size[0])
    rule = FlatRule(patch_size=patch, threshold=THRESHOLD, n_filters=N_FILTERS, filter_seed=seed)
    # the plan (channels, units, direction) depends on the seed only, not on the image size
    plan = _plan(module, spec, torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        random_init(module, g)
        reserve(module, plan, spec.layers[0], rule)
        scales = _calibrate(module, plan, spec, img_size)
        helpers = _plant(module, plan, spec, scales, g)
    module.eval()
    first, second = spec.layers
    cfg = module.pretrained_cfg
    truth = GroundTruth(
        name=name,
        architecture=spec.architecture,
        model_args=dict(img_size=img_size, num_classes=0, **spec.args),
        seed=seed,
        layers=spec.layers,
        units=tuple((layer, u) for layer in spec.layers for u in plan.units[layer]),
        rule=rule,
        first_outlier_layer=first,
        expected_norm_ratio=NORM_RATIO,
        sink_layers=tuple(range(first + 1, len(module.blocks))),
        helper_units=tuple(helpers),
        mean=tuple(float(m) for m in cfg["mean"]),
        std=tuple(float(s) for s in cfg["std"]),
        causal_units=tuple((first, u) for u in plan.units[first]),
        reader_units=tuple((second, u) for u in plan.units[second]),
        emergence_layer=first,
    )
    return module, truth


def build_unplanted(name: str, img_size: int = 224, seed: int = 0) -> nn.Module:
    """The same architecture and realistic random weights as ``build(name)``, with no plant:
    the control on which artifact detectors must find nothing."""
    spec = _spec(name)
    module = create(spec, img_size)
    with torch.no_grad():
        random_init(module, torch.Generator().manual_seed(seed + 7919))
    module.vitreg_weights = "random"
    return module.eval()
