"""Adapters for hierarchical timm models: Swin (windowed attention) and PVT-v2 (reduced keys).

There is no [CLS], no register and no token insertion (blocks assume exactly h*w tokens). Hook
names are stage-aware: ``stages.{s}.blocks.{j}.hook_resid_pre|ln1.hook_out|attn.hook_pattern|
hook_resid_mid|ln2.hook_out|mlp.hook_post|hook_resid_post``, then ``stages.{s}.hook_out`` (the
stage output as the next stage receives it) and ``ln_final.hook_out`` (the tokens :meth:`features`
returns). Token tensors are grids ``[B, h, w, C]``; each site's layout is its stage's grid
(``n_cls=0``, effective patch size = the stage's stride in pixels). The model-level layout and
``d_model``/``n_heads``/``d_mlp`` describe the final stage, whose tokens ``features`` returns.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.hooks.attention import PatternSite, capture_qk, softmax_pattern
from vitreg.hooks.patterns import PatternRead, PatternReading
from vitreg.hooks.sites import InputSite, OutputSite, Site
from vitreg.models.adapters.base import EXACT, Adapter, Family, register_adapter
from vitreg.models.adapters.timm_vit import image_grid

Grid = tuple[int, int]


@dataclass
class WindowPatternSite(PatternSite):
    """Swin ``attn.hook_pattern``: ``[B*nW, H, A, A]``, A = window area (49 for 7x7 windows).

    The stage grid is rolled by ``blk.shift_size`` (odd blocks), zero-padded to a multiple of
    ``blk.window_size`` and cut into nW = ceil(h/wh)*ceil(w/ww) windows, row-major per image.
    In shifted windows, keys that the roll brought from another region are masked (-100), so
    they get ~0 probability. Read natively at ``attn.attn_drop`` (fusion off), editable.
    ``block``: the Swin block, whose window and shift size place each window on the grid.
    """

    block: nn.Module | None = None

    def reading(self, layout: TokenLayout) -> PatternReading:
        how = "mean attention received from the queries of the patch's window (shift undone)"
        read = partial(read_windows, block=self.block)
        return PatternReading(read, "mean_received", how, "the query's window")


@dataclass
class ReducedPatternSite(PatternSite):
    """PVT-v2 ``attn.hook_pattern``: ``[B, H, N, N_kv]``, N = h*w queries of the stage grid.

    Keys come from the spatially reduced grid (``attn.sr`` conv, stride ``sr_ratio``: N_kv =
    (h//sr)*(w//sr); 7x7 pooled for linear attention). Recomputed from ``attn.q``/``attn.kv``
    outputs under fused attention, native at ``attn.attn_drop`` otherwise.
    """

    def reading(self, layout: TokenLayout) -> PatternReading:
        how = "mean attention received by each spatially reduced key, on the key grid"
        read = partial(read_reduced, attn=self.attn)
        return PatternReading(read, "mean_received", how, "the reduced keys")


def read_windows(p: torch.Tensor, layout: TokenLayout, block: nn.Module) -> PatternRead:
    """Swin ``[B*nW, H, A, A]``: received attention per key, averaged over the valid queries of
    its window, put back on the grid (padding cropped, cyclic shift undone)."""
    (gh, gw), (wh, ww), (sh, sw) = layout.grid, block.window_size, block.shift_size
    nh, nw = -(-gh // wh), -(-gw // ww)
    n_win, area, heads = nh * nw, wh * ww, p.shape[1]
    if p.shape[0] % n_win or p.shape[-1] != area:
        raise InputError(
            f"Swin pattern {tuple(p.shape)} does not fit {n_win} windows of {wh}x{ww} on a "
            f"{gh}x{gw} grid"
        )
    b = p.shape[0] // n_win
    valid = torch.zeros(nh * wh, nw * ww, device=p.device)
    valid[:gh, :gw] = 1.0  # the block rolls, then pads bottom/right: padding is never a real token
    valid = valid.view(nh, wh, nw, ww).permute(0, 2, 1, 3).reshape(n_win, area)
    win = p.view(b, n_win, heads, area, area)
    received = torch.einsum("bnhqk,nq->bnhk", win, valid) / valid.sum(1)[None, :, None, None]
    grid = received.view(b, nh, nw, heads, wh, ww).permute(0, 3, 1, 4, 2, 5)
    grid = grid.reshape(b, heads, nh * wh, nw * ww)[:, :, :gh, :gw]
    grid = torch.roll(grid, shifts=(sh, sw), dims=(2, 3))
    return PatternRead(grid, win, valid[:, None, :], layout.grid)


def reduced_key_grid(attn: nn.Module, grid: Grid) -> Grid:
    """The key grid of a PVT-v2 attention module on a token ``grid`` (pooled, strided, or same)."""
    if getattr(attn, "pool", None) is not None:
        size = attn.pool.output_size
        return (size, size) if isinstance(size, int) else tuple(size)
    sr = getattr(attn, "sr", None)
    if sr is None:
        return grid
    out = []
    for dim, n in enumerate(grid):
        k, s, pad, d = sr.kernel_size[dim], sr.stride[dim], sr.padding[dim], sr.dilation[dim]
        out.append((n + 2 * pad - d * (k - 1) - 1) // s + 1)
    return tuple(out)


def read_reduced(p: torch.Tensor, layout: TokenLayout, attn: nn.Module) -> PatternRead:
    """PVT-v2 ``[B, H, N, N_kv]``: mean attention received by each reduced key, on the key grid."""
    kh, kw = reduced_key_grid(attn, layout.grid)
    if p.shape[-1] != kh * kw:
        raise InputError(f"PVT-v2 pattern {tuple(p.shape)} does not match a {kh}x{kw} key grid")
    heads = p.mean(2).reshape(p.shape[0], p.shape[1], kh, kw)
    same = (kh, kw) == tuple(layout.grid) and getattr(attn, "pool", None) is None
    return PatternRead(heads, p, None, layout.grid if same else None)


def _conv_out(n: int, conv: nn.Conv2d, dim: int) -> int:
    """Output length of ``conv`` along spatial ``dim`` (0 = height, 1 = width) for input length n."""
    k, s, p, d = conv.kernel_size[dim], conv.stride[dim], conv.padding[dim], conv.dilation[dim]
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


class _HierAdapter(Adapter):
    """Shared stage bookkeeping: per-stage grids from the last input size, grid-shaped sites."""

    family = "timm-hier"  # one family; the adapter class tells Swin from PVT-v2
    source = "timm"
    hierarchical = True
    supports_insertion = False

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        self._image_size = self.default_image_size()
        self.input_module().register_forward_pre_hook(self._record_size)

    def _record_size(self, _mod: nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
            self._image_size = (int(args[0].shape[-2]), int(args[0].shape[-1]))

    # family specifics ---------------------------------------------------------------
    @abstractmethod
    def stages(self) -> list[nn.Module]: ...

    @abstractmethod
    def stage_blocks(self, stage: nn.Module) -> list[nn.Module]: ...

    @abstractmethod
    def stage_grids(self, image_size: Grid) -> list[Grid]:
        """Token grid of every stage for an input size; :class:`InputError` if it can't run."""

    @abstractmethod
    def stage_strides(self) -> list[Grid]:
        """Effective patch size (pixels per token) of every stage."""

    @abstractmethod
    def block_sites(
        self, p: str, layer: int, blk: nn.Module, grid: Callable[[], Grid]
    ) -> list[Site]:
        """Sites of one block, named under ``p``, in forward order."""

    @abstractmethod
    def stage_out_site(self, name: str, stage: nn.Module, grid: Callable[[], Grid]) -> Site: ...

    @abstractmethod
    def final_site(self, grid: Callable[[], Grid]) -> Site: ...

    # structure -------------------------------------------------------------------------
    @property
    def stage_depths(self) -> tuple[int, ...]:
        return tuple(len(self.stage_blocks(s)) for s in self.stages())

    @property
    def n_layers(self) -> int:
        return sum(self.stage_depths)

    @property
    def _last_block(self) -> nn.Module:
        return self.stage_blocks(self.stages()[-1])[-1]

    @property
    def d_model(self) -> int:
        return int(self.module.num_features)

    @property
    def d_mlp(self) -> int:
        return int(self._last_block.mlp.fc2.in_features)

    @property
    def n_heads(self) -> int:
        return int(self._last_block.attn.num_heads)

    def grid_for(self, image_size: Grid) -> Grid:
        return self.stage_grids(image_size)[-1]

    def base_layout(self) -> TokenLayout:
        return TokenLayout(0, 0, self.grid_for(self.default_image_size()), self.stage_strides()[-1])

    def stage_layout(self, s: int) -> TokenLayout:
        """Layout of stage ``s`` at the last input size (the default size before any input)."""
        return TokenLayout(0, 0, self.stage_grids(self._image_size)[s], self.stage_strides()[s])

    def input_module(self) -> nn.Module:
        return self.module.patch_embed

    def data_config(self) -> dict:
        from timm.data import resolve_model_data_config

        cfg = resolve_model_data_config(self.module)
        cfg["input_size"] = (3, *self.default_image_size())
        return cfg

    # hooks --------------------------------------------------------------------------------
    def build_sites(self) -> dict[str, Site]:
        sites: dict[str, Site] = {}
        layer = 0
        for s, stage in enumerate(self.stages()):

            def layout_fn(_model_layout: Any, s: int = s) -> TokenLayout:
                return self.stage_layout(s)

            def grid(s: int = s) -> Grid:
                return self.stage_grids(self._image_size)[s]

            staged: list[Site] = []
            for j, blk in enumerate(self.stage_blocks(stage)):
                staged += self.block_sites(f"stages.{s}.blocks.{j}", layer, blk, grid)
                layer += 1
            staged.append(self.stage_out_site(f"stages.{s}.hook_out", stage, grid))
            for site in staged:
                site.layout_fn = layout_fn
                sites[site.name] = site
        last = len(self.stages()) - 1
        final = self.final_site(lambda: self.stage_grids(self._image_size)[last])
        final.layout_fn = lambda _model_layout: self.stage_layout(last)
        sites[final.name] = final
        return sites


def seq_grid(grid: Callable[[], Grid]) -> dict[str, Callable]:
    """to_canon/from_canon between ``[B, h*w, C]`` and the stage grid ``[B, h, w, C]``."""

    def to_canon(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(t.shape[0], *grid(), t.shape[-1])

    return {"to_canon": to_canon, "from_canon": lambda new, old: new.reshape(old.shape)}


def nchw_grid() -> dict[str, Callable]:
    """to_canon/from_canon between ``[B, C, h, w]`` and ``[B, h, w, C]``."""
    return {
        "to_canon": lambda t: t.permute(0, 2, 3, 1),
        "from_canon": lambda new, old: new.permute(0, 3, 1, 2).contiguous(),
    }


@register_adapter(EXACT)
class TimmSwinAdapter(_HierAdapter):
    """timm ``SwinTransformer``: NHWC stages of shifted-window blocks, final LayerNorm ``norm``."""

    families = (
        Family(
            "swin",
            "Swin Transformer",
            "timm",
            ("timm:swin_tiny_patch4_window7_224.ms_in1k",),
            (
                "Hierarchical: no [CLS], 4 stages of NHWC token grids with their own layouts.",
                "Attention is windowed (49x49 per window, shifted on odd blocks), not global.",
                "Takes no extra tokens: test-time registers do not apply.",
            ),
        ),
    )

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        try:
            from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock
        except ImportError:  # pragma: no cover - timm is a core dependency
            return False
        return isinstance(module, SwinTransformer) and all(
            isinstance(b, SwinTransformerBlock) for s in module.layers for b in s.blocks
        )

    def stages(self) -> list[nn.Module]:
        return list(self.module.layers)

    def stage_blocks(self, stage: nn.Module) -> list[nn.Module]:
        return list(stage.blocks)

    def default_image_size(self) -> Grid:
        return tuple(int(s) for s in self.module.patch_embed.img_size)

    def stage_grids(self, image_size: Grid) -> list[Grid]:
        pe = self.module.patch_embed
        hint = "load it with img_size=(H, W) or dynamic_img_size=True"
        h, w = image_grid(
            image_size, pe.patch_size, pe.img_size, not pe.strict_img_size, pe.dynamic_img_pad, hint
        )
        grids = []
        for stage in self.stages():
            if not isinstance(stage.downsample, nn.Identity):  # PatchMerging pads odd sizes
                h, w = -(-h // 2), -(-w // 2)
            grids.append((h, w))
        return grids

    def stage_strides(self) -> list[Grid]:
        ph, pw = self.module.patch_embed.patch_size
        strides = []
        for stage in self.stages():
            if not isinstance(stage.downsample, nn.Identity):
                ph, pw = 2 * ph, 2 * pw
            strides.append((ph, pw))
        return strides

    def block_sites(
        self, p: str, layer: int, blk: nn.Module, grid: Callable[[], Grid]
    ) -> list[Site]:
        seq = seq_grid(grid)  # norm2 and the MLP see [B, h*w, C]
        return [
            InputSite(f"{p}.hook_resid_pre", layer, module=blk, kwarg="x"),
            OutputSite(f"{p}.ln1.hook_out", layer, module=blk.norm1),
            WindowPatternSite(
                f"{p}.attn.hook_pattern",
                layer,
                attn=blk.attn,
                native_module=blk.attn.attn_drop,
                block=blk,
            ),
            InputSite(f"{p}.hook_resid_mid", layer, module=blk.norm2, **seq),
            OutputSite(f"{p}.ln2.hook_out", layer, module=blk.norm2, **seq),
            OutputSite(f"{p}.mlp.hook_post", layer, module=blk.mlp.drop1, **seq),
            OutputSite(f"{p}.hook_resid_post", layer, module=blk),
        ]

    def attention_path(self) -> str:
        return "windowed; hook_pattern [B*nW, H, A, A] read natively (fusion switched off if on)"

    def stage_out_site(self, name: str, stage: nn.Module, grid: Callable[[], Grid]) -> Site:
        return OutputSite(name, None, module=stage)

    def final_site(self, grid: Callable[[], Grid]) -> Site:
        return OutputSite("ln_final.hook_out", None, module=self.module.norm)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Final-stage tokens after the final ``norm``, flattened row-major to ``[B, h*w, C]``."""
        return self.module.forward_features(x).flatten(1, 2)


def _pvt_pattern(attn: nn.Module) -> Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]:
    """``compute`` for :func:`capture_qk` from PVT's ``q`` and ``kv`` Linear outputs."""

    def compute(q_out: torch.Tensor, kv_out: torch.Tensor, _kw: dict) -> torch.Tensor:
        b, heads = q_out.shape[0], attn.num_heads
        q = q_out.reshape(b, q_out.shape[1], heads, -1).transpose(1, 2)
        k = kv_out.reshape(b, kv_out.shape[1], 2, heads, -1)[:, :, 0].transpose(1, 2)
        return softmax_pattern(q, k, attn.scale)

    return compute


@register_adapter(EXACT)
class TimmPvtV2Adapter(_HierAdapter):
    """timm ``PyramidVisionTransformerV2``: blocks take ``(x [B, N, C], feat_size)``; each stage
    ends with its own LayerNorm and emits NCHW."""

    families = (
        Family(
            "pvt_v2",
            "PVT-v2",
            "timm",
            ("timm:pvt_v2_b0.in1k",),
            (
                "Hierarchical: no [CLS], 4 stages; spatial-reduction attention gives N x N_kv "
                "patterns.",
                "The MLP has a depthwise conv; neurons are read after its activation.",
                "Takes no extra tokens and no img_size argument (any size works).",
            ),
        ),
    )

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        try:
            from timm.models.pvt_v2 import Block, PyramidVisionTransformerV2
        except ImportError:  # pragma: no cover - timm is a core dependency
            return False
        return isinstance(module, PyramidVisionTransformerV2) and all(
            isinstance(b, Block) for s in module.stages for b in s.blocks
        )

    def stages(self) -> list[nn.Module]:
        return list(self.module.stages)

    def stage_blocks(self, stage: nn.Module) -> list[nn.Module]:
        return list(stage.blocks)

    def default_image_size(self) -> Grid:
        cfg = getattr(self.module, "pretrained_cfg", None) or {}
        return tuple(int(s) for s in cfg.get("input_size", (3, 224, 224))[1:])

    def _embeds(self) -> list[nn.Conv2d | None]:
        """The conv that sets each stage's grid (None: the stage keeps its input grid)."""
        convs = [self.module.patch_embed.proj]
        return convs + [
            s.downsample.proj if s.downsample is not None else None for s in self.stages()[1:]
        ]

    def stage_grids(self, image_size: Grid) -> list[Grid]:
        h, w = image_size
        grids = []
        for s, (stage, conv) in enumerate(zip(self.stages(), self._embeds(), strict=True)):
            if conv is not None:
                h, w = _conv_out(h, conv, 0), _conv_out(w, conv, 1)
            attn = stage.blocks[0].attn
            if attn.pool is None and attn.sr is not None:  # linear attention pools to 7x7 instead
                kh, kw = attn.sr.kernel_size
                if h < kh or w < kw:
                    raise InputError(
                        f"a {image_size[0]}x{image_size[1]} image gives PVT-v2 stage {s} a {h}x{w} "
                        f"token grid, smaller than its {kh}x{kw} spatial-reduction conv; use larger "
                        f"images, e.g. {self.default_image_size()[0]} px (model.transform resizes)"
                    )
            grids.append((h, w))
        return grids

    def stage_strides(self) -> list[Grid]:
        sh, sw = 1, 1
        strides = []
        for conv in self._embeds():
            if conv is not None:
                sh, sw = sh * conv.stride[0], sw * conv.stride[1]
            strides.append((sh, sw))
        return strides

    def block_sites(
        self, p: str, layer: int, blk: nn.Module, grid: Callable[[], Grid]
    ) -> list[Site]:
        seq, attn = seq_grid(grid), blk.attn
        return [
            InputSite(f"{p}.hook_resid_pre", layer, module=blk, kwarg="x", **seq),
            OutputSite(f"{p}.ln1.hook_out", layer, module=blk.norm1, **seq),
            ReducedPatternSite(
                f"{p}.attn.hook_pattern",
                layer,
                attn=attn,
                native_module=attn.attn_drop,
                capture=capture_qk(attn, attn.q, attn.kv, _pvt_pattern(attn)),
            ),
            InputSite(f"{p}.hook_resid_mid", layer, module=blk.norm2, **seq),
            OutputSite(f"{p}.ln2.hook_out", layer, module=blk.norm2, **seq),
            # mlp.act, not mlp.drop: drop fires twice per call (after act and after fc2)
            OutputSite(f"{p}.mlp.hook_post", layer, module=blk.mlp.act, **seq),
            OutputSite(f"{p}.hook_resid_post", layer, module=blk, **seq),
        ]

    def attention_path(self) -> str:
        fused = any(b.attn.fused_attn for s in self.stages() for b in s.blocks)
        how = "recomputed from attn.q/attn.kv" if fused else "read natively from attn.attn_drop"
        return f"spatial-reduction keys; hook_pattern [B, H, N, N_kv] {how}"

    def stage_out_site(self, name: str, stage: nn.Module, grid: Callable[[], Grid]) -> Site:
        """After the stage's own LayerNorm, as the next stage receives it."""
        return OutputSite(name, None, module=stage, **nchw_grid())

    def final_site(self, grid: Callable[[], Grid]) -> Site:
        return OutputSite(
            "ln_final.hook_out", None, module=self.stages()[-1].norm, **seq_grid(grid)
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Final-stage tokens after that stage's LayerNorm (PVT's last norm), ``[B, h*w, C]``."""
        return self.module.forward_features(x).flatten(2).transpose(1, 2)
