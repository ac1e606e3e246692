"""Training data: open a dataset spec, a seeded sample order, per-sample generators.

Sample ``i`` of the global batch at ``step`` is a function of (seed, step, i) only: the order is
a seeded permutation per epoch, and each sample's augmentations draw from a generator seeded
with (seed, step, i). Ranks take contiguous slices of the global batch, so any world size and
any gradient-accumulation split see exactly the same images.

Before training, :func:`open_data` reads every sample of a vitreg dataset once
(:meth:`~vitreg.data.datasets.BaseDataset.scan`, evenly spaced beyond ``SCAN_LIMIT``): no usable
sample is an error naming the split and the reasons, one usable sample a
:class:`~vitreg.data.datasets.DataWarning` (one class is one too, from :func:`num_classes`, which
only the supervised recipe asks); :func:`describe_training_data` is the ``data`` block of the
run's metrics.json (usable samples, skips by reason, warnings).
"""

from __future__ import annotations

import hashlib
import warnings
from functools import lru_cache
from typing import Any

import torch

from vitreg.data.datasets import (
    SCAN_LIMIT,
    DataWarning,
    ScanSummary,
    SkipSample,
    require_usable,
)
from vitreg.errors import InputError, SpecError
from vitreg.results.schema import DataInfo, plain
from vitreg.results.train import TrainingData


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across processes, unlike ``hash``)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def generator(*parts: object) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(derive_seed(*parts))
    return g


@lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randperm(n, generator=generator(seed, "order", epoch)).tolist())


def dataset_index(seed: int, step: int, i: int, batch_size: int, n: int) -> int:
    """Dataset index of sample ``i`` of the global batch at 0-based ``step``."""
    pos = step * batch_size + i
    return _epoch_order(seed, pos // n, n)[pos % n]


def open_data(data: Any, scan: bool = True) -> Any:
    """A dataset object as is, or a spec string opened with ``open_dataset(spec, "train")``.

    With ``scan``, a vitreg dataset (one with ``scan()``) is read once here, so that a set with
    no usable sample fails before any model is built (naming the split and the skip reasons),
    and one usable sample warns (:class:`DataWarning`). The scan is kept on the object: pass
    the opened dataset on (to ``train`` and :func:`describe_training_data`) to read it once.
    """
    if isinstance(data, str):
        from vitreg.data.datasets import open_dataset

        data = open_dataset(data, "train")
    if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        raise SpecError(
            f"training data must be a dataset spec (e.g. 'synthetic-cls:n=64,size=32' or "
            f"'imagefolder:DIR') or an object with __len__ and __getitem__, got {type(data).__name__}"
        )
    if len(data) == 0:
        raise InputError("the training dataset is empty; point --data at a folder with images")
    if scan and callable(getattr(data, "scan", None)):
        summary = data.scan(SCAN_LIMIT)
        require_usable(data, "training", summary["n_usable"], summary["skipped"])
        _warn_once(data, "_warned_data", data_warnings(data, summary, labels=False))
    return data


def _warn_once(data: Any, flag: str, messages: list[str]) -> None:
    if messages and not getattr(data, flag, False):  # once per dataset object
        for message in messages:
            warnings.warn(message, DataWarning, stacklevel=3)
        setattr(data, flag, True)


def data_warnings(data: Any, summary: ScanSummary | None, labels: bool = True) -> list[str]:
    """Why training on ``data`` may mislead: one usable sample only (from the ``scan``
    summary) and, with ``labels`` (the supervised recipe), fewer than two classes in the
    listing or among the usable samples."""
    spec = _spec(data)
    out = []
    if summary and summary["n_usable"] == 1 and summary["scanned"] == summary["n"]:
        out.append(
            f"only 1 usable sample in {spec} ({summary['n']} listed): training repeats this "
            "one image; add images"
        )
    return out + (class_warnings(data, summary) if labels else [])


def class_warnings(data: Any, summary: ScanSummary | None) -> list[str]:
    """Fewer than two classes: in the listing (``describe()["warnings"]``) or, from the
    ``scan`` summary, among the usable samples."""
    out = list(data.describe().get("warnings", [])) if hasattr(data, "describe") else []
    classes = summary["classes_seen"] if summary else None
    if not out and classes == 1 and (getattr(data, "num_classes", None) or 0) >= 2:
        out.append(f"the usable samples of {_spec(data)} hold one class only: labels teach nothing")
    return out


def describe_training_data(data: Any, recipe: str = "supervised") -> DataInfo:
    """The ``data`` block of a training run's metrics.json: what was trained on, how many
    samples are usable, the skips by reason (``skipped``: reason -> words, ``log``: every count
    of the dataset), and ``warnings`` (class warnings only for a recipe that uses labels, i.e.
    not ``"dino"``). ``data`` is a spec (opened and scanned here) or the dataset
    :func:`open_data` returned (its scan is reused)."""
    data = open_data(data) if isinstance(data, str) else data
    n = len(data)
    if not callable(getattr(data, "scan", None)):
        return DataInfo(description=_spec(data), n_images=n, n_listed=n, warnings=[])
    summary: ScanSummary = data.scan(SCAN_LIMIT)
    full = summary["scanned"] == n
    skipped = {r: f"{k} samples skipped" for r, k in summary["skipped"].items()}
    if not full:
        skipped = {r: f"{v} (of {summary['scanned']} read)" for r, v in skipped.items()}
    log: dict[str, int] = data.log.to_dict() if hasattr(data, "log") else {}
    return DataInfo(
        description=_spec(data),
        n_images=summary["n_usable"] if full else n,
        skipped=skipped,
        n_listed=n,
        n_usable=summary["n_usable"],
        scanned=summary["scanned"],
        log=log,
        warnings=data_warnings(data, summary, labels=recipe != "dino"),
        dataset=plain(data.describe()),
    )


def data_identity(data: Any) -> TrainingData:
    """What a run trains on, recorded in every checkpoint so that a resume on other data is
    refused: the spec (or class name), the sample count and, for vitreg datasets, the
    fingerprint of the listing."""
    fingerprint = getattr(data, "fingerprint", None)
    return TrainingData(
        spec=_spec(data),
        n=len(data),
        fingerprint=fingerprint() if callable(fingerprint) else None,
    )


def _spec(data: Any) -> str:
    if hasattr(data, "describe"):
        return str(data.describe().get("spec", type(data).__name__))
    return type(data).__name__


def num_classes(data: Any) -> int:
    """Class count of a labelled dataset (``num_classes``), needed by the supervised recipe."""
    targets = getattr(data, "targets", None)
    if (
        isinstance(targets, tuple)
        and all(isinstance(t, str) for t in targets)
        and "label" not in targets
    ):
        raise InputError(
            f"the supervised recipe needs class labels, and {_spec(data)} provides "
            f"{list(targets) or 'no'} targets, not labels; use a labelled dataset "
            "(imagefolder:DIR, synthetic-cls:...) or --recipe dino"
        )
    n = getattr(data, "num_classes", None)
    if n and callable(getattr(data, "scan", None)):  # labels matter now: say if they cannot teach
        _warn_once(data, "_warned_classes", class_warnings(data, data.scan(SCAN_LIMIT)))
    if not n:
        raise InputError(
            "the supervised recipe needs class labels, and this dataset has none "
            "(num_classes is missing); use a labelled dataset or --recipe dino"
        )
    return int(n)


def read_sample(data: Any, index: int) -> tuple[Any, int | None]:
    """(image, label) of ``data[index]``; an unreadable sample is replaced by the next readable one."""
    n = len(data)
    for k in range(n):
        try:
            item = data[(index + k) % n]
        except SkipSample:
            continue
        if isinstance(item, tuple):
            return item[0], (int(item[1]) if len(item) > 1 and item[1] is not None else None)
        label = getattr(item, "label", None)
        return item.image, (int(label) if label is not None else None)
    raise InputError("no sample of the training dataset could be read; check the data")
