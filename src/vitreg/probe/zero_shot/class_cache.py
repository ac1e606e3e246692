"""Class embeddings kept on disk: the text side of zero-shot runs 80 prompts per class through
the text tower (80,000 for ImageNet: minutes on a CPU), and depends only on the CLIP's weights,
the class names and the templates; so it is computed once per cache folder and read back after.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save as save_tensors
from torch import Tensor

from vitreg.core.containment import check_inside
from vitreg.core.io import write_bytes_atomic
from vitreg.probe.zero_shot.text import ClipTowers, class_embeddings
from vitreg.progress import SILENT, Progress

FOLDER = "zero-shot-classes"


def class_key(towers: ClipTowers, names: list[str], templates: list[str]) -> str:
    """Hash of everything the class embeddings depend on."""
    identity = {"clip": towers.name, "weights": towers.weights, "names": names}
    blob = json.dumps(identity | {"templates": templates}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cached_class_embeddings(
    towers: ClipTowers,
    names: list[str],
    templates: list[str],
    root: str | Path | None,
    progress: Progress = SILENT,
) -> tuple[Tensor, Path | None, bool]:
    """:func:`class_embeddings`, read from ``root`` when an earlier run stored them (else
    computed, in a phase of ``progress``, and stored there); returns ``(embeddings, file or
    None, reused?)``."""

    def compute() -> Tensor:
        label = f"embedding {len(names)} class names × {len(templates)} templates (prompts)"
        with progress(len(names) * len(templates), label) as update:
            return class_embeddings(towers, names, templates, update)

    if root is None:
        return compute(), None, False
    path = Path(root) / FOLDER / f"{class_key(towers, names, templates)}.safetensors"
    if (
        path.is_symlink() or (Path(root) / FOLDER).is_symlink()
    ):  # containment: no link leads out of the cache
        check_inside(root, path, "class-embedding cache file")
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor("classes"), path, True
    except Exception:  # missing or damaged: computed again and rewritten
        pass
    classes = compute()
    meta = {"clip": towers.name, "classes": str(len(names)), "templates": str(len(templates))}
    write_bytes_atomic(path, save_tensors({"classes": classes.contiguous()}, metadata=meta))
    return classes, path, False
