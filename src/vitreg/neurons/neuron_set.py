"""NeuronSet: register neurons (layer, unit, score) with the settings, data and model that made them.

Saved as ``NAME.safetensors`` (the tensors) + ``NAME.json`` (everything else); never pickled.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitreg.errors import InputError, VitregError
from vitreg.report.io import write_bytes_atomic, write_json_atomic

FORMAT = "vitreg.neuron_set/1"


def weights_fingerprint(module: torch.nn.Module) -> str:
    """A short hash of every parameter's name, shape and a strided sample of its values."""
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        flat = p.detach().reshape(-1).float().cpu()
        sample = flat[:: max(1, flat.numel() // 256)][:256]
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class NeuronSet:
    """Register neurons ranked by score (highest first)."""

    layers: list[int]
    units: list[int]
    scores: list[float]
    model_spec: str | None = None
    model_family: str | None = None
    n_layers: int | None = None
    d_mlp: int | None = None
    fingerprint: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (len(self.layers) == len(self.units) == len(self.scores)):
            raise InputError("a NeuronSet needs as many layers as units and scores")

    def __len__(self) -> int:
        return len(self.units)

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.layers, self.units, strict=True))

    def by_layer(self) -> dict[int, list[int]]:
        """``{layer: [units]}`` in layer order."""
        out: dict[int, list[int]] = {}
        for layer, unit in self.pairs():
            out.setdefault(layer, []).append(unit)
        return dict(sorted(out.items()))

    def top(self, k: int) -> NeuronSet:
        """The ``k`` highest-scoring neurons."""
        return self.pick(sorted(range(len(self)), key=lambda i: -self.scores[i])[:k])

    def first(self, k: int) -> NeuronSet:
        """The first ``k`` neurons in stored order (a ranking's best; a causal set's first chosen)."""
        return self.pick(list(range(min(k, len(self)))))

    def pick(self, order: list[int]) -> NeuronSet:
        """The neurons at positions ``order``, in that order."""
        return NeuronSet(
            [self.layers[i] for i in order],
            [self.units[i] for i in order],
            [self.scores[i] for i in order],
            self.model_spec,
            self.model_family,
            self.n_layers,
            self.d_mlp,
            self.fingerprint,
            {**self.settings, "top_k": len(order)},
            dict(self.data),
        )

    def check_fits(self, model: Any) -> None:
        """Raise if this set was made for another architecture or names units the model lacks."""
        mine = f"{self.model_spec or 'unknown model'} ({self.n_layers} layers, d_mlp {self.d_mlp})"
        theirs = f"{model.spec or type(model.module).__name__} ({model.n_layers} layers, d_mlp {model.d_mlp})"
        if (self.n_layers, self.d_mlp) != (None, None) and (self.n_layers, self.d_mlp) != (
            model.n_layers,
            model.d_mlp,
        ):
            raise VitregError(
                f"this NeuronSet was made for {mine} but the model is {theirs}; "
                "run neuron discovery on this model"
            )
        bad = [
            (l_, u)
            for l_, u in self.pairs()
            if not (0 <= l_ < model.n_layers and 0 <= u < model.d_mlp)
        ]
        if bad:
            raise VitregError(
                f"NeuronSet names units outside the model {theirs}: {bad[:5]} (made for {mine})"
            )

    # persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "neurons": [
                {"layer": l_, "unit": u, "score": s}
                for l_, u, s in zip(self.layers, self.units, self.scores, strict=True)
            ],
            "model_spec": self.model_spec,
            "model_family": self.model_family,
            "n_layers": self.n_layers,
            "d_mlp": self.d_mlp,
            "fingerprint": self.fingerprint,
            "settings": self.settings,
            "data": self.data,
        }

    def save(self, path: str | Path) -> Path:
        """Write ``path.safetensors`` and ``path.json``; returns the JSON path."""
        from safetensors.torch import save

        base = Path(path).with_suffix("")
        tensors = {
            "layers": torch.tensor(self.layers, dtype=torch.int64),
            "units": torch.tensor(self.units, dtype=torch.int64),
            "scores": torch.tensor(self.scores, dtype=torch.float64),
        }
        write_bytes_atomic(
            base.with_suffix(".safetensors"), save(tensors, metadata={"format": FORMAT})
        )
        return write_json_atomic(base.with_suffix(".json"), self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> NeuronSet:
        """Read a set saved by :meth:`save` (either file's path, or the common stem)."""
        from safetensors.torch import load_file

        base = Path(path).with_suffix("")
        meta_path, tensor_path = base.with_suffix(".json"), base.with_suffix(".safetensors")
        if not meta_path.is_file():
            raise VitregError(
                f"no NeuronSet at {str(meta_path)!r} (expected NAME.json + NAME.safetensors)"
            )
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as e:
            raise VitregError(f"{str(meta_path)!r} is not valid JSON: {e}") from e
        if meta.get("format") != FORMAT:
            raise VitregError(f"{str(meta_path)!r} is not a vitreg NeuronSet ({FORMAT})")
        if tensor_path.is_file():
            t = load_file(str(tensor_path))
            layers, units, scores = t["layers"].tolist(), t["units"].tolist(), t["scores"].tolist()
        else:
            rows = meta["neurons"]
            layers, units, scores = ([r[k] for r in rows] for k in ("layer", "unit", "score"))
        return cls(
            layers,
            units,
            scores,
            meta.get("model_spec"),
            meta.get("model_family"),
            meta.get("n_layers"),
            meta.get("d_mlp"),
            meta.get("fingerprint"),
            meta.get("settings", {}),
            meta.get("data", {}),
        )
