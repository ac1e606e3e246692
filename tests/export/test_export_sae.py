"""A real client: overcomplete trains its TopK sparse autoencoder on an export's shards, read
through ``vitreg.export.open`` and a torch ``DataLoader``, and its loss falls."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
import torch
from torch.utils.data import DataLoader

import vitreg
from vitreg.configs import ExportConfig
from vitreg.export import open as open_export


def overcomplete_sae(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - the library's module
    """``overcomplete.sae``, imported on this matplotlib (which dropped ``cm.get_cmap``)."""
    if not hasattr(matplotlib.cm, "get_cmap"):
        monkeypatch.setattr(matplotlib.cm, "get_cmap", matplotlib.colormaps.get_cmap, raising=False)
    return pytest.importorskip("overcomplete.sae")


def test_overcomplete_trains_a_topk_sae_on_the_shards(
    tmp_path: Path, cli_models, monkeypatch: pytest.MonkeyPatch
) -> None:
    sae = overcomplete_sae(monkeypatch)
    cfg = ExportConfig(spec="planted:dinov2_s14", img_size=56, limit=8, batch_size=4,
                       shard_size=3, layers="9", tokens="patches", out=tmp_path / "x")  # fmt: skip
    vitreg.run(cfg)
    tokens = open_export(tmp_path / "x")
    assert len(tokens) == 8 * 16
    loader = DataLoader(tokens.shards(), batch_size=32)
    torch.manual_seed(0)
    model = sae.TopKSAE(384, nb_concepts=256, top_k=16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def mse(x, x_hat, pre_codes, codes, dictionary):  # noqa: ANN001, ANN202 - overcomplete's signature
        return (x - x_hat).square().mean()

    logs = sae.train_sae(model, loader, mse, optimizer, nb_epochs=8, monitoring=1)
    losses = logs["avg_loss"]
    assert len(losses) == 8 and losses[-1] < 0.75 * losses[0], losses
    assert all(b < a for a, b in zip(losses[:-1], losses[1:], strict=True)), (
        losses
    )  # every epoch lower
