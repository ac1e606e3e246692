"""LOST (Siméoni et al., BMVC 2021): one object box per image from the patch-feature affinity.

The foreground is assumed to cover fewer patches than the background, so the patch with the
fewest positive affinities (lowest degree) is taken as the seed. The seed set is widened with the
``k`` lowest-degree patches that correlate positively with the seed; a patch joins the mask when
its summed affinity to the seed set is non-negative; the box is the bounding box of the mask's
connected component that holds the seed. Darcet et al. and Jiang et al. add a constant ``bias`` to
the affinity (swept in [-1, 0] with L2-normalised features), which is supported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage
from torch import Tensor

from vitreg.errors import InputError


@dataclass
class LostResult:
    """The box (xyxy pixels), the seed (row, col), the seed set and the mask on the patch grid."""

    box: np.ndarray  # (4,) float32 x0, y0, x1, y1
    seed: tuple[int, int]
    seeds: np.ndarray  # (S, 2) rows/cols of the expanded seed set
    mask: np.ndarray  # (h, w) bool, patches positively correlated with the seed set
    component: np.ndarray  # (h, w) bool, the mask's connected component holding the seed


def lost(
    features: Tensor,
    patch_size: int | tuple[int, int],
    *,
    grid: tuple[int, int] | None = None,
    k: int = 100,
    bias: float = 0.0,
    normalize: bool = True,
    image_size: tuple[int, int] | None = None,
) -> LostResult:
    """Run LOST on the patch features of one image: ``[h, w, d]`` or ``[N, d]`` with ``grid``.

    ``k`` = size of the low-degree pool for seed expansion (100 in the paper); ``bias`` is added
    to every affinity; ``normalize`` L2-normalises features first. The box is in pixels of the
    model input (patch units × ``patch_size``), clipped to ``image_size`` (height, width) if given.
    """
    if features.dim() == 3:
        grid = (int(features.shape[0]), int(features.shape[1]))
        features = features.reshape(-1, features.shape[-1])
    if grid is None or features.dim() != 2 or grid[0] * grid[1] != features.shape[0]:
        raise InputError(
            f"lost wants features [h, w, d], or [N, d] with grid=(h, w) and h*w == N; "
            f"got {tuple(features.shape)} and grid={grid}"
        )
    f = features.double()
    if normalize:
        f = torch.nn.functional.normalize(f, dim=-1)
    affinity = f @ f.T + bias
    positive = affinity >= 0
    degree = positive.sum(1)
    seed = int(degree.argmin())
    pool = degree.argsort(stable=True)[: max(1, k)]
    seeds = pool[positive[pool, seed] & (pool != seed)]
    seeds = torch.cat([torch.tensor([seed]), seeds])  # the seed always belongs to its own set
    mask = (affinity[:, seeds].sum(1) >= 0).reshape(grid).numpy()
    r, c = divmod(seed, grid[1])
    mask[r, c] = True  # a strongly negative bias must not leave the seed outside the mask
    labels, _ = ndimage.label(mask)
    component = labels == labels[r, c]
    rows, cols = np.nonzero(component)
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    box = np.array(
        [cols.min() * pw, rows.min() * ph, (cols.max() + 1) * pw, (rows.max() + 1) * ph],
        dtype=np.float32,
    )
    if image_size is not None:
        box = np.minimum(box, [image_size[1], image_size[0]] * 2).astype(np.float32)
    pos = np.stack(np.divmod(seeds.numpy(), grid[1]), -1)
    return LostResult(box, (r, c), pos, mask, component)
