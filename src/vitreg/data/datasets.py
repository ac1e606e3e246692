"""Labeled datasets for probes: one ``Sample`` type, a spec-string registry, counted bad input.

``open_dataset("voc:/data/VOC2012", "val")`` returns a :class:`LabeledDataset`. Known names live
in :data:`DATASETS` (filled by :mod:`vitreg.data.formats` and :mod:`vitreg.data.synthetic`).

How bad input surfaces: every defect of a sample is found when the sample is read.
``dataset[i]`` either returns a :class:`Sample` (repaired where the standard protocols repair:
unknown mask ids -> :data:`IGNORE_INDEX`, invalid depth -> NaN, both counted in pixels) or
counts the reason and raises :class:`SkipSample` (unreadable or over-budget image, missing,
mis-sized or wholly invalid target, a target the dataset declares left empty). Counts go to
``dataset.log`` (a :class:`DataLog`), once per (reason, sample key), so reading a sample twice
(several epochs, a resumed cache) does not inflate them. Entries that cannot be samples at all
(wrong suffix, outside any class folder, hidden, dangling links, FIFOs) are counted when the
folder is listed. Consumers iterate with :func:`iter_samples`, which skips bad samples; a split
left with no usable sample is an error naming the split and the counted reasons
(:func:`require_usable`). What the listing alone shows to be suspect (one class only) is in
``describe()["warnings"]``; :meth:`BaseDataset.scan` reads the samples and counts what is usable.
The log lives in the process that reads; with DataLoader workers, read in the main process or
merge the logs.

Boxes are ``xyxy`` in pixel-edge coordinates of the original image: a box over pixel columns
``a..b`` (inclusive) is ``x0 = a, x1 = b + 1``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

import numpy as np
from PIL import Image
from pydantic import JsonValue

from vitreg.core.registry import Registry
from vitreg.errors import InputError, SpecError, VitregError

IGNORE_INDEX = 255
SPLITS = ("train", "val")
TARGETS = ("label", "mask", "depth", "boxes")
EXAMPLES_PER_REASON = 5
SCAN_LIMIT = 10_000  # samples :meth:`BaseDataset.scan` reads at most (evenly spaced beyond it)


class ScanSummary(TypedDict):
    """What :meth:`BaseDataset.scan` counted: samples listed, read and usable, skips by reason,
    and the classes among the usable samples (``None`` for a dataset without labels)."""

    n: int
    scanned: int
    n_usable: int
    skipped: dict[str, int]
    classes_seen: int | None


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


class DataWarning(UserWarning):
    """Data that can be used but whose results would mislead (one class, one sample)."""


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
    def describe(self) -> dict[str, JsonValue]: ...


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
        self._scan: tuple[int | None, ScanSummary] | None = None

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
        sample = self._read(i % n)
        for target in self.targets:  # a target the dataset declares is never silently absent
            if getattr(sample, target, None) is None:
                raise self.skip(f"missing_{target}", sample.key)
        return sample

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

    def warnings(self) -> list[str]:
        """What the listing shows to be suspect, in words (reading no sample): a labelled set
        with fewer than two classes, whose classification scores would say nothing."""
        if "label" in self.targets and self.num_classes is not None and self.num_classes < 2:
            names = ", ".join(self.class_names or []) or "none"
            return [
                f"only {self.num_classes} class ({names}) in {self.spec}: a classifier learns "
                "nothing from it and top-1 = 1.0 says nothing; add images of other classes"
            ]
        return []

    def describe(self) -> dict[str, JsonValue]:
        """JSON-ready identity of the data: spec, split, size, targets, content fingerprint, and
        ``warnings`` (only when there are any; see :meth:`warnings`)."""
        out: dict[str, JsonValue] = {
            "spec": self.spec,
            "name": self.name,
            "split": self.split,
            "n": len(self),
            "targets": list(self.targets),
            "num_classes": self.num_classes,
            "fingerprint": self.fingerprint(),
        }
        warned = self.warnings()
        return out | ({"warnings": warned} if warned else {})

    def scan(self, limit: int | None = SCAN_LIMIT) -> ScanSummary:
        """Read the samples (all, or ``limit`` evenly spaced ones) and count what is usable
        (:class:`ScanSummary`).
        Skips are counted in :attr:`log` as on any read; the result is kept (a second call with
        the same ``limit`` reads nothing)."""
        if self._scan is not None and self._scan[0] == limit:
            return self._scan[1].copy()
        n = len(self)
        if limit is None or n <= limit:
            indices: Iterable[int] = range(n)
        else:
            indices = sorted({int(round(v)) for v in np.linspace(0, n - 1, max(1, limit))})
        scanned, usable = 0, 0
        skipped: Counter[str] = Counter()
        labels: set[int] = set()
        for i in indices:
            scanned += 1
            try:
                sample = self[i]
            except SkipSample as e:
                skipped[e.reason] += 1
                continue
            usable += 1
            if sample.label is not None:
                labels.add(int(sample.label))
        result: ScanSummary = {
            "n": n,
            "scanned": scanned,
            "n_usable": usable,
            "skipped": dict(sorted(skipped.items())),
            "classes_seen": len(labels) if "label" in self.targets else None,
        }
        self._scan = (limit, result)
        return result.copy()


Builder = Callable[[str, str, str, str], LabeledDataset]  # (name, arg, split, spec) -> dataset
DATASETS: Registry[Builder] = Registry(
    "datasets", modules=("vitreg.data.formats", "vitreg.data.synthetic")
)


def register_dataset(*names: str) -> Callable[[Builder], Builder]:
    """Register a builder in :data:`DATASETS` under one or more spec names (``name:arg``)."""

    def wrap(builder: Builder) -> Builder:
        for name in names:
            DATASETS.register(name, builder)
        return builder

    return wrap


def open_dataset(spec: str, split: str = "train") -> LabeledDataset:
    """The dataset a spec string names, e.g. ``voc:DIR`` or ``synthetic-seg:n=200,size=64``."""
    if split not in SPLITS:
        raise SpecError(f"unknown split {split!r}; use one of {list(SPLITS)}")
    name, _, arg = spec.strip().partition(":")
    if name not in DATASETS:
        raise SpecError(
            f"unknown dataset {name!r} in {spec!r}; known: {sorted(DATASETS)} "
            "(e.g. imagefolder:DIR, voc:DIR, synthetic-seg:n=200)"
        )
    return DATASETS[name](name, arg.strip(), split, spec.strip())


def require_usable(
    dataset: LabeledDataset, role: str, n_usable: int, skipped: Mapping[str, int]
) -> None:
    """Raise :class:`InputError` when ``dataset`` (used as the ``role`` split, e.g. "test")
    has no usable sample, naming the split and the reasons its samples were skipped."""
    if n_usable > 0:
        return
    spec = dataset.describe().get("spec", getattr(dataset, "name", "?"))
    reasons = ", ".join(f"{r}: {k}" for r, k in sorted(skipped.items())) or "no reason counted"
    split = getattr(dataset, "split", role)
    raise InputError(
        f"the {role} split ({split} of {spec}) has no usable sample: all {len(dataset)} listed "
        f"samples were skipped ({reasons}); fix or remove those files"
    )


def iter_samples(
    dataset: LabeledDataset, indices: Iterable[int] | None = None
) -> Iterator[tuple[int, Sample]]:
    """``(index, sample)`` for every usable sample; bad ones are skipped (and counted by the set)."""
    for i in range(len(dataset)) if indices is None else indices:
        try:
            yield i, dataset[i]
        except SkipSample:
            continue
