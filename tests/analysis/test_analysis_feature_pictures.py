"""Feature pictures: the streamed PCA equals the PCA of all patches, colours are in [0, 1], the
similarity map is 1 at the centre patch, and merged reducers give the single-process answer."""

from __future__ import annotations

import numpy as np
import torch

from vitreg.analysis.feature_pictures import PatchFeatures, pca_basis, similarity_maps
from vitreg.results.diagnose import PCA


def streamed(x: torch.Tensor, keep: int, batch: int = 3) -> PatchFeatures:
    r = PatchFeatures("blocks.0.hook_resid_post", keep=keep)
    for start in range(0, len(x), batch):
        r(x[start : start + batch], None, start)  # [B, h, w, C] grids need no layout
    return r


def test_streamed_pca_is_the_pca_of_every_patch() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 4, 5, 8, generator=g) * torch.linspace(0.2, 3.0, 8)
    stats = streamed(x, keep=2).result()
    flat = x.reshape(-1, 8).double()
    assert stats["count"] == 7 * 20 and stats["features"].shape == (2, 4, 5, 8)
    assert torch.allclose(stats["mean"], flat.mean(0))
    assert torch.allclose(stats["cov"], torch.cov(flat.T, correction=0), atol=1e-10)
    basis = pca_basis(stats)
    values, vectors = np.linalg.eigh(np.cov(flat.numpy().T, bias=True))
    for i in range(3):
        top = vectors[:, -1 - i]
        assert abs(abs(float(basis.components[i] @ torch.from_numpy(top))) - 1) < 1e-8
    assert basis.explained == sorted(basis.explained, reverse=True)
    assert abs(basis.explained[0] - values[-1] / values.sum()) < 1e-8
    assert isinstance(basis.pca, PCA) and basis.pca.n_patches == basis.n_patches == 7 * 20
    assert basis.explained is basis.pca.explained_variance  # held once, by the results model
    rgb = basis.fit_colours(stats["features"]).rgb(stats["features"])
    assert rgb.shape == (2, 4, 5, 3) and rgb.min() >= 0 and rgb.max() <= 1
    assert rgb.max() == 1 and rgb.min() == 0  # the 1st/99th percentiles span the colours


def test_merged_reducers_give_the_single_pass_answer() -> None:
    x = torch.randn(6, 3, 3, 4, generator=torch.Generator().manual_seed(1))
    whole = streamed(x, keep=4).result()
    a, b = streamed(x[:3], keep=4), PatchFeatures("blocks.0.hook_resid_post", keep=4)
    b(x[3:], None, 3)
    a.merge(b)
    merged = a.result()
    assert torch.allclose(merged["cov"], whole["cov"]) and merged["count"] == whole["count"]
    assert torch.equal(merged["features"], whole["features"])


def test_similarity_is_one_at_the_centre_patch() -> None:
    x = torch.randn(2, 5, 4, 6, generator=torch.Generator().manual_seed(2))
    sim = similarity_maps(x)
    assert sim.shape == (2, 5, 4)
    assert torch.allclose(sim[:, 2, 2], torch.ones(2))
    assert sim.abs().max() <= 1 + 1e-6
