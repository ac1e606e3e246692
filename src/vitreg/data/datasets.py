"""Labeled datasets for probes: one ``Sample`` type, a spec-string registry, counted bad input.

``open_dataset("voc:/data/VOC2012", "val")`` returns a :class:`LabeledDataset`. Known names live
in :data:`DATASETS` (filled by :mod:`vitreg.data.formats` and :mod:`vitreg.data.synthetic`).

How bad input surfaces: every defect of a sample is found when the sample is read.
``dataset[i]`` either returns a :class:`Sample` (repaired where the standard protocols repair:
unknown mask ids -> :data:`IGNORE_INDEX`, invalid depth -> NaN, both counted in pixels) or
counts the reason and raises :class:`SkipSample` (unreadable image, missing or mis-sized target).
Counts go to ``dataset.log`` (a :class:`DataLog`), once per (reason, sample key), so reading a
sample twice (several epochs, a resumed cache) does not inflate them. Files that cannot be
samples at all (wrong suffix, outside any class folder) are counted when the folder is listed.
Consumers iterate with :func:`iter_samples`, which skips bad samples. The log lives in the
process that reads; with DataLoader workers, read in the main process or merge the logs.

Boxes are ``xyxy`` in pixel-edge coordinates of the original image: a box over pixel columns
``a..b`` (inclusive) is ``x0 = a, x1 = b + 1``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from PIL import Image

from vitreg.errors import SpecError, VitregError

IGNORE_INDEX = 255
SPLITS = ("train", "val")
TARGETS = ("label", "mask", "depth", "boxes")
EXAMPLES_PER_REASON = 5


@dataclass
class Sample:
    """One image and its targets; targets a dataset does not provide stay ``None``."""

    image: Image.Image
    key: str
    label: int | None = None
    mask: np.ndarray | None = None  # (H, W) int64, IGNORE_INDEX = ignored pixel
    depth: np.ndarray | None = None  # (H, W) float32 metres, NaN = invalid pixel
    boxes: np.ndarray | None = None  # (K, 4) float32 xyxy, pixels of the original image


class SkipSample(VitregError):
    """A sample that cannot be used (already counted in the dataset's log); skip it."""

    def __init__(self, reason: str, key: str) -> None:
        super().__init__(f"skipped {key!r}: {reason}")
        self.reason = reason
        self.key = key


class DataLog:
    """Counts of skipped samples and repaired pixels by reason, plus a few example keys each."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._seen: set[tuple[str, str]] = set()
        self.examples: dict[str, list[str]] = {}

    def count(self, reason: str, n: int = 1, key: str | None = None) -> None:
        """Add ``n`` to ``reason``; with a ``key``, only the first report per (reason, key) counts."""
        if key is not None:
            if (reason, key) in self._seen:
                return
            self._seen.add((reason, key))
            shown = self.examples.setdefault(reason, [])
            if len(shown) < EXAMPLES_PER_REASON:
                shown.append(key)
        self._counts[reason] += int(n)

    def to_dict(self) -> dict[str, int]:
        return dict(sorted(self._counts.items()))


@runtime_checkable
class LabeledDataset(Protocol):
    """What tasks and the feature cache consume."""

    name: str
    split: str
    targets: tuple[str, ...]
    num_classes: int | None
    class_names: list[str] | None
    log: DataLog

    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> Sample: ...
    def describe(self) -> dict: ...


class BaseDataset:
    """Shared plumbing: index checks, counted skips, ``describe``; subclasses implement ``_read``."""

    num_classes: int | None = None
    class_names: list[str] | None = None

    def __init__(self, name: str, spec: str, split: str, targets: tuple[str, ...]) -> None:
        self.name = name
        self.spec = spec
        self.split = split
        self.targets = targets
        self.log = DataLog()
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        raise NotImplementedError

    def _read(self, i: int) -> Sample:
        raise NotImplementedError

    def _fingerprint_parts(self) -> Iterable[Any]:
        """JSON-able values that change whenever the samples would change."""
        raise NotImplementedError

    def __getitem__(self, i: int) -> Sample:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {self.spec} ({n} samples)")
        return self._read(i % n)

    def skip(self, reason: str, key: str) -> SkipSample:
        """Count ``reason`` for ``key`` and return the exception to raise."""
        self.log.count(reason, key=key)
        return SkipSample(reason, key)

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            h = hashlib.sha256()
            for part in self._fingerprint_parts():
                h.update(json.dumps(part, sort_keys=True).encode())
                h.update(b"\n")
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def describe(self) -> dict:
        """JSON-ready identity of the data: spec, split, size, targets, content fingerprint."""
        return {
            "spec": self.spec,
            "name": self.name,
            "split": self.split,
            "n": len(self),
            "targets": list(self.targets),
            "num_classes": self.num_classes,
            "fingerprint": self.fingerprint(),
        }


Builder = Callable[[str, str, str, str], LabeledDataset]  # (name, arg, split, spec) -> dataset
DATASETS: dict[str, Builder] = {}


def register_dataset(*names: str) -> Callable[[Builder], Builder]:
    """Register a builder under one or more spec names (``name:arg``)."""

    def wrap(builder: Builder) -> Builder:
        for name in names:
            DATASETS[name] = builder
        return builder

    return wrap


def _load_builtin() -> None:
    from vitreg.data import formats, synthetic  # noqa: F401  (registration side effect)


def open_dataset(spec: str, split: str = "train") -> LabeledDataset:
    """The dataset a spec string names, e.g. ``voc:DIR`` or ``synthetic-seg:n=200,size=64``."""
    _load_builtin()
    if split not in SPLITS:
        raise SpecError(f"unknown split {split!r}; use one of {list(SPLITS)}")
    name, _, arg = spec.strip().partition(":")
    if name not in DATASETS:
        raise SpecError(
            f"unknown dataset {name!r} in {spec!r}; known: {sorted(DATASETS)} "
            "(e.g. imagefolder:DIR, voc:DIR, synthetic-seg:n=200)"
        )
    return DATASETS[name](name, arg.strip(), split, spec.strip())


def iter_samples(
    dataset: LabeledDataset, indices: Iterable[int] | None = None
) -> Iterator[tuple[int, Sample]]:
    """``(index, sample)`` for every usable sample; bad ones are skipped (and counted by the set)."""
    for i in range(len(dataset)) if indices is None else indices:
        try:
            yield i, dataset[i]
        except SkipSample:
            continue
