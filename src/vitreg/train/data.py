"""Training data: open a dataset spec, a seeded sample order, per-sample generators.

Sample ``i`` of the global batch at ``step`` is a function of (seed, step, i) only: the order is
a seeded permutation per epoch, and each sample's augmentations draw from a generator seeded
with (seed, step, i). Ranks take contiguous slices of the global batch, so any world size and
any gradient-accumulation split see exactly the same images.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

import torch

from vitreg.data.datasets import SkipSample
from vitreg.errors import InputError, SpecError


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


def open_data(data: Any) -> Any:
    """A dataset object as is, or a spec string opened with ``open_dataset(spec, "train")``."""
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
    return data


def num_classes(data: Any) -> int:
    """Class count of a labelled dataset (``num_classes``), needed by the supervised recipe."""
    n = getattr(data, "num_classes", None)
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
