"""Register-neuron discovery (Jiang et al. 2025, Algorithm 1), batched and streaming.

For every image with outliers at the detection layer, each MLP unit of the searched layers gets
the mean activation over the outlier positions; scores are those means averaged over such
images, ranked globally over (layer, unit). Activations of the searched layers are held only for
the current batch (memory independent of the image count); the statistics are sums, so under
torchrun they are all-reduced and every rank gets the single-process ranking.
"""

from __future__ import annotations

from typing import Any

import torch

from vitreg import distributed
from vitreg.analysis.rules import MASK_RULES, image_mask
from vitreg.errors import VitregError
from vitreg.fix.neuron_set import NeuronSet, weights_fingerprint
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, iter_batches
from vitreg.neurons.detection import Detection, choose_detection, layer_index
from vitreg.progress import Update

THRESHOLDS = MASK_RULES
outlier_mask = image_mask  # ``[B, N]`` outlier mask from per-token norms under a rule


def discover(
    model: Model,
    data: Any,
    *,
    detect_layer: int | None = None,
    highest_layer: int | None = None,
    lowest_layer: int = 0,
    threshold: str | float = "auto",
    signed: bool = False,
    sparsity: tuple[float, float] | None = None,
    include_prefix: bool = False,
    top_k: int = 64,
    batch_size: int = 32,
    limit: int | None = None,
    calibration_images: int = 32,
    detection: Detection | None = None,
    progress: Update | None = None,
) -> NeuronSet:
    """Rank register neurons; returns the ``top_k`` best as a :class:`NeuronSet`.

    ``threshold``: 'auto' (valley of the bimodal norm distribution), a number (absolute norm),
    'mean3std' (per image, paper A.4) or 'robust' (per image, median + 3.5 MAD on log norms);
    the rules are those of :mod:`vitreg.analysis.rules`.
    What is not given -- detection layer, 'auto' threshold, and (then) the highest searched
    layer -- is chosen by :func:`~vitreg.neurons.detection.choose_detection` on the first
    ``calibration_images`` (or taken from ``detection``): the searched range then ends at the
    emergence layer. With ``detect_layer`` and a numeric or per-image ``threshold`` given, nothing
    is surveyed and ``highest_layer`` defaults to the detection layer (the paper's settings
    reproduce its ranking); a ``highest_layer`` above the detection layer is honoured (those
    units are scored against the outliers found below them, as the official code scores all).

    ``signed=False`` averages ``|activation|`` like the official code; ``sparsity=(a, f)`` keeps a
    unit's per-image score only if at least a fraction ``f`` of tokens have activation below
    ``a`` (the reference notebook's filter). Outliers are patch tokens unless ``include_prefix``
    (the official code counts [CLS] among them: ``include_prefix=True`` reproduces it).

    Under torchrun every rank passes the same ``data``: each scores its part of every batch
    (:func:`vitreg.distributed.shard`) -- or its own shards of a webdataset source
    (:func:`vitreg.distributed.split`) --, the survey is one sharded ``Model.trace``, and the
    sums are all-reduced, so every rank returns the single-process ranking.
    """
    n_layers = model.n_layers
    rule = "absolute" if isinstance(threshold, (int, float)) else threshold
    if rule not in THRESHOLDS:
        raise ValueError(f"threshold must be one of {THRESHOLDS} or a number, got {threshold!r}")
    if detection is None and (rule == "auto" or detect_layer is None):
        detection = choose_detection(
            model,
            data,
            detect_layer=detect_layer,
            highest_layer=highest_layer,
            lowest_layer=max(0, lowest_layer),
            threshold=threshold,
            n_images=calibration_images,
            batch_size=batch_size,
        )
    if detection is not None:
        detect, highest = detection.detect_layer, detection.highest_layer
        rule, value = detection.threshold, detection.threshold_value
        lowest_layer = detection.lowest_layer
    else:
        detect = layer_index(detect_layer, n_layers, "detection layer")
        highest = layer_index(highest_layer if highest_layer is not None else detect, n_layers)
        value = float(threshold) if rule == "absolute" else None
    searched = list(range(max(0, lowest_layer), highest + 1))
    score_sum = torch.zeros(len(searched), model.d_mlp, dtype=torch.float64)
    images_with = torch.zeros((), dtype=torch.float64)
    images_seen = torch.zeros((), dtype=torch.float64)
    held: dict[int, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}

    def add(j: int, acts: torch.Tensor) -> None:
        """Add each image's mean activation over its outlier tokens to layer j's scores."""
        w, has = state["weights"], state["has"]
        per_image = torch.einsum("bn,bnu->bu", w, acts)
        if sparsity is not None:
            a, f = sparsity
            sparse = (acts < a).float().mean(1) >= f  # [B, U]
            per_image = per_image * sparse
        score_sum[j] += per_image[has].double().sum(0).cpu()

    def keep(j: int, layer: int):
        def fn(t: torch.Tensor, hook: HookContext) -> None:
            acts = t.detach().float() if signed else t.detach().float().abs()
            if layer <= detect:
                held[j] = acts  # scored once the detection layer has found the outliers
            else:
                add(j, acts)

        return fn

    def score(t: torch.Tensor, hook: HookContext) -> None:
        nonlocal images_with, images_seen
        lay = hook.layout
        norms = t.detach().float().norm(dim=-1)
        mask = image_mask(norms, rule, value)
        if not include_prefix:
            mask[:, lay.prefix] = False
        count = mask.sum(1)  # [B]
        state["has"] = count > 0
        images_seen += t.shape[0]
        images_with += state["has"].sum()
        state["weights"] = mask.float() / count.clamp_min(1)[:, None]  # mean over outliers
        for j in list(held):
            add(j, held.pop(j))

    stream = distributed.split(data, limit) or distributed.shard(
        iter_batches(data, batch_size, limit)
    )  # this rank's images
    hooks = [
        (hook_name(layer, "mlp.hook_post"), keep(j, layer)) for j, layer in enumerate(searched)
    ]
    hooks.append((hook_name(detect, "hook_resid_post"), score))
    last = max(detect, highest) + 1  # later blocks feed none of these hooks: they don't run
    sums = {"score_sum": score_sum, "images_with": images_with, "images_seen": images_seen}
    key = {"kind": "discover", "layers": [searched[0], detect, last], "rule": rule, "value": value}
    key.update(signed=signed, sparsity=sparsity, prefix=include_prefix, batch_size=batch_size)
    ckpt, skip, finished = resume_sums(key | {"limit": limit}, sums, stream.independent)

    def done(n: int) -> None:
        if ckpt is not None:
            ckpt.step(stream.seen, lambda: sums)
        if progress is not None:
            progress(stream.seen)  # images of all ranks

    fresh = (part for part in stream if stream.seen > skip)  # parts the checkpoint lacks
    with model.hooks(hooks):
        model.run_batches(fresh, batch_size, None, done, stop_at_layer=last)
    if progress is not None and stream.independent:  # this rank's last part may end early
        progress(stream.seen)  # the image count of all ranks
    if ckpt is not None and not finished:
        ckpt.save(stream.seen, sums, done=True)
    if stream.world > 1:
        for t in (score_sum, images_with, images_seen):
            distributed.all_reduce_sum(t)
    if images_with.item() == 0:
        raise VitregError(
            f"none of the {int(images_seen.item())} images has an outlier token at layer {detect} "
            "under this threshold; discovery would rank noise. Lower the threshold, pick another "
            "detection layer, or run `vitreg diagnose` first"
        )
    scores = score_sum / images_with
    flat = scores.flatten()
    k = min(top_k, flat.numel())
    top = flat.topk(k)
    units = (top.indices % model.d_mlp).tolist()
    layers = [searched[i] for i in (top.indices // model.d_mlp).tolist()]
    settings = {
        "detect_layer": detect,
        "highest_layer": highest,
        "lowest_layer": max(0, lowest_layer),
        "threshold": rule,
        "threshold_value": value,
        "signed": signed,
        "sparsity": list(sparsity) if sparsity else None,
        "include_prefix": include_prefix,
        "top_k": k,
        "detection": detection.to_dict() if detection else None,
    }
    data_desc = {
        "n_images": int(images_seen.item()),
        "n_images_with_outliers": int(images_with.item()),
    }
    return NeuronSet(
        layers,
        units,
        [float(s) for s in top.values],
        model.spec,
        model.family,
        n_layers,
        model.d_mlp,
        weights_fingerprint(model.module),
        settings,
        data_desc,
    )


def resume_sums(
    key: dict[str, Any], sums: dict[str, torch.Tensor], independent: bool = False
) -> tuple[Any, int, bool]:
    """The checkpoint of a discovery pass inside ``vitreg.core.checkpoint.resumable`` (else
    ``None``), the images its saved sums cover (copied into ``sums``) and whether it finished;
    ``independent``: each rank reads its own images and resumes from its own last state."""
    from vitreg.core.checkpoint import next_pass

    ckpt = next_pass(key | {"split": "by rank"} if independent else key)
    if ckpt is None:
        return None, 0, False
    seen, finished, state = ckpt.resume(together=not independent)
    if state is not None:
        for name, t in sums.items():
            t.copy_(state[name])
    return ckpt, seen, finished
