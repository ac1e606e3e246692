"""Loading a verb's model and its images: the spec with the input size where the source takes
it, the device, and the image source (a folder, the sample photos, or synthetic images)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from vitreg.errors import InputError, VitregError
from vitreg.progress import Progress
from vitreg.verbs.result import Notice, Notices

DEFAULT_SYNTHETIC = 16  # images for planted models without images (and in the embedded demo)


def size_kwargs(source: str, img_size: int | None, random_weights: bool) -> dict[str, int]:
    """The constructor argument that sets the input size for ``source``, if it has one.

    HF towers take ``image_size`` as a config override, which only a random-weight build can
    follow (pretrained DINOv2 interpolates positions at run time instead).
    """
    if not img_size or (source == "hf" and not random_weights):
        return {}
    names = {"hf": "image_size", "open_clip": "force_image_size"}
    return {names.get(source, "img_size"): img_size}


def load_spec(spec: str, pretrained: bool, weights: Path | None, img_size: int | None) -> Any:
    """``vitreg.load`` with the input size passed where the source's constructor takes it."""
    from vitreg.models.load import load, parse_spec

    source, _ = parse_spec(spec)
    random_weights = not pretrained and weights is None
    kwargs = size_kwargs(source, img_size, random_weights=random_weights)
    if random_weights:  # the same random weights on every run and every torchrun rank
        import torch

        torch.manual_seed(0)
    # loader notes are shown by describe(); source libraries' own chatter is not
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                return load(spec, pretrained=pretrained, weights=weights, **kwargs)
            except TypeError as e:
                if not kwargs or not any(k in str(e) for k in kwargs):  # e.g. PVT-v2: any size
                    raise
                return load(spec, pretrained=pretrained, weights=weights)
    finally:
        logging.disable(logging.NOTSET)


def move(model: Any, device: str | None) -> Any:
    """``model`` on ``device`` (unchanged when none is given); a device this machine lacks is an
    :class:`InputError` naming the option."""
    if device is None:
        return model
    import torch

    from vitreg.device import check_device

    check_device(device)  # meta, a missing GPU or a wrong name: the one --device message
    try:
        return model.to(torch.device(device))
    except (RuntimeError, AssertionError) as e:
        raise InputError(
            f"cannot use device {device!r}: {str(e).splitlines()[0]}; "
            "pass --device cpu (or a device this machine has, e.g. cuda:0)"
        ) from None


def random_init_notice(spec: str, how: str = "built with --random-init") -> Notice:
    """The notice, before any result, that ``spec`` has random weights (and ``how``)."""
    return Notice(
        "random_init",
        f"RANDOM WEIGHTS: {spec} has random, untrained weights ({how}); its artifacts, or "
        "their absence, say nothing about the trained model.",
        caution=True,
    )


def load_model(
    spec: str,
    random_init: bool,
    img_size: int | None,
    device: str | None,
    weights: Path | None,
    progress: Progress,
    notices: Notices,
) -> Any:
    """Load ``spec`` (from ``weights`` if given) and move it to ``device``; the loader's notes
    and the random-weights notice go to ``notices``."""
    with progress(None, f"loading {spec}"):
        model = load_spec(spec, not random_init, weights, img_size)
    model = move(model, device)
    for note in model.notes:
        notices.append(Notice("model", note, caution=True))
    if model.weights == "random":  # how it was loaded decides, not the option alone
        how = "built with --random-init" if random_init else "no trained weights were loaded"
        notices.append(random_init_notice(spec, how))
    return model


def image_source(
    model: Any,
    spec: str,
    images: Path | None,
    samples: bool,
    limit: int | None,
    batch_size: int,
    notices: Notices,
    keep: int = 0,
) -> Any:
    """The image source for ``model``: the folder, the sample photos, or synthetic images (a
    planted model, or one saved from it, without images); ``keep`` images are kept for figures. Announced in
    ``notices``."""
    from vitreg import distributed
    from vitreg.data import images as data
    from vitreg.data import wds

    common = {"batch_size": batch_size, "keep": keep}
    if wds.is_wds(images):
        source = wds.wds_images(model, images, limit=limit, **common)
        unsplit = source.split_note(distributed.world())
        if unsplit is not None:
            notices.append(Notice("images", unsplit, caution=True))
    elif images is not None:
        source = data.folder_images(model, images, limit=limit, **common)
    elif samples:
        source = data.sample_source(model, limit=limit, **common)
    elif model.weights == "planted":  # planted:, and saved planted models and VLMs
        source = data.synthetic_source(model, n=limit or DEFAULT_SYNTHETIC, **common)
    else:
        try:
            source = data.sample_source(model, limit=limit, **common)
        except VitregError as e:
            raise InputError(
                f"{spec} is not a planted model, so it needs real images and none were given: "
                "pass --images DIR (a folder of .jpg/.png files), or use the bundled photos with "
                f"--samples after `pip install 'vitreg[samples]'` ({e})"
            ) from None
    text = f"images: up to {source.total} from {source.label}"
    notices.append(Notice("images", text, caution=source.synthetic))
    return source


def model_and_images(
    cfg: Any, device: str | None, progress: Progress, notices: Notices, keep: int = 0
) -> tuple[Any, Any]:
    """The model of ``cfg`` (a :class:`~vitreg.configs.ModelImages` with its spec filled in)
    on ``device``, and its image source (``keep`` images kept for figures)."""
    spec = cfg.spec
    model = load_model(spec, cfg.random_init, cfg.img_size, device, cfg.weights, progress, notices)
    source = image_source(
        model, spec, cfg.images, cfg.samples, cfg.limit, cfg.batch_size, notices, keep
    )
    return model, source


def check_images(images: Path | None) -> None:
    """An empty or missing image folder (or missing shards) fails here, before any model is
    loaded."""
    from vitreg.data import wds

    if wds.is_wds(images):
        wds.shard_paths(images)
    elif images is not None:
        from vitreg.data.folder import list_images

        list_images(images)
