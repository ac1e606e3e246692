"""Where a model's weights come from: the four kinds every loader records and every report
states, so no conclusion is drawn about a trained model from one that was never loaded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from vitreg.errors import WeightsError, brief

WeightKind = Literal["trained", "random", "planted", "user"]

#: each kind, as the reports describe it
WEIGHT_KINDS: dict[str, str] = {
    "trained": "trained weights: the source's pretrained ones (hub or cache), or vitreg train's",
    "random": "random, untrained weights (pretrained=False, --random-init)",
    "planted": "synthetic: random weights with planted register neurons (a test fixture)",
    "user": "weights supplied by the user (--weights FILE, a local: folder, vitreg.wrap)",
}


def check_weights_file(path: str | os.PathLike) -> Path:
    """A weights file must exist and be a safetensors file or a torch state dict."""
    p = Path(path).expanduser()
    shown = brief(str(p), 200)
    try:
        is_dir, is_file = p.is_dir(), p.is_file()
    except OSError as e:  # a name too long for the file system, a component not a folder
        raise WeightsError(
            f"weights file {shown} cannot be examined ({e.strerror}); check the path"
        ) from None
    if is_dir:
        raise WeightsError(
            f"weights file {shown} is a folder, not a file; pass the weights file itself "
            "(e.g. model.safetensors), or load a saved folder as 'local:DIR'"
        )
    if not is_file:
        raise WeightsError(f"weights file {shown} does not exist; check the path")
    if p.suffix not in WEIGHT_SUFFIXES:
        raise WeightsError(
            f"weights file {shown} has suffix {brief(p.suffix, 40)}; vitreg reads .safetensors "
            "(preferred) or torch state dicts (.pth/.pt/.bin, loaded with weights_only=True)"
        )
    return p


WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
