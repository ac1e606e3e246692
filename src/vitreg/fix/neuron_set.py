"""NeuronSet: register neurons (layer, unit, score) with the settings, data and model that made them.

Saved as ``NAME.safetensors`` (the tensors) + ``NAME.json`` (everything else); never pickled.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from vitreg.core.io import write_bytes_atomic, write_json_atomic
from vitreg.errors import InputError
from vitreg.results.neurons import NeuronSetSettings

FORMAT = "vitreg.neuron_set/1"
SUFFIXES = (".json", ".safetensors")


class NeuronRow(BaseModel):
    """One neuron of ``NAME.json``: block index, MLP unit, finite score."""

    model_config = ConfigDict(extra="forbid", strict=True)

    layer: int = Field(ge=0, le=100_000)
    unit: int = Field(ge=0, le=100_000_000)
    score: float = Field(allow_inf_nan=False)


class _Recorded(BaseModel):
    """What each setting a NeuronSet file records may hold (checked when a file is read)."""

    settings: NeuronSetSettings


def _settings(raw: dict[str, JsonValue], meta_path: Path) -> dict[str, JsonValue]:
    """The settings with a numeric threshold written as the ``absolute`` rule and its value."""
    out = dict(raw)
    rule, value = out.get("threshold"), out.get("threshold_value")
    if isinstance(rule, (int, float)):
        if value is not None and value != rule:
            raise InputError(
                f"NeuronSet file {str(meta_path)!r}: settings.threshold is the norm {rule} but "
                f"settings.threshold_value is {value}; give one (threshold 'absolute' and "
                "threshold_value N)"
            )
        out["threshold"], out["threshold_value"] = "absolute", float(rule)
    elif rule == "absolute" and value is None:
        raise InputError(
            f"NeuronSet file {str(meta_path)!r}: settings.threshold is 'absolute' but "
            "settings.threshold_value is missing; it needs the norm, a number > 0"
        )
    return out


COLUMNS = ("layers", "units", "scores")
#: the arguments of ``NeuronSet(...)`` in their positional order
ARGUMENTS = (*COLUMNS, "model_spec", "model_family", "n_layers", "d_mlp", "fingerprint")
ARGUMENTS += ("settings", "data")


def _from_columns(args: tuple[Any, ...], named: dict[str, Any]) -> dict[str, Any]:
    """The model's fields from the constructor's arguments: the neurons from the ``layers``,
    ``units`` and ``scores`` columns (taken as given: a file's rows are checked when it is
    read), no settings or data as empty ones."""
    if len(args) > len(ARGUMENTS):
        raise TypeError(f"NeuronSet takes at most {len(ARGUMENTS)} arguments ({len(args)} given)")
    fields = dict(zip(ARGUMENTS, args, strict=False))
    twice = sorted(set(fields) & set(named))
    if twice:
        raise TypeError(f"NeuronSet got {', '.join(twice)} twice")
    fields.update(named)
    layers, units, scores = (list(fields.pop(k, None) or []) for k in COLUMNS)
    if not (len(layers) == len(units) == len(scores)):
        raise InputError("a NeuronSet needs as many layers as units and scores")
    fields["neurons"] = [
        NeuronRow.model_construct(layer=int(l_), unit=int(u), score=float(s))
        for l_, u, s in zip(layers, units, scores, strict=True)
    ]
    for key in ("settings", "data"):
        fields[key] = fields.get(key) or {}
    return fields


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


class NeuronSet(BaseModel):
    """Register neurons ranked by score (highest first), with the model, settings and data that
    made them: the fields are ``NAME.json``'s (its schema), ``settings`` and ``data`` the
    record as written (JSON, kept as read, checked against
    :class:`~vitreg.results.neurons.NeuronSetSettings` when a file is read).

    Built as ``NeuronSet(layers, units, scores, model_spec, ..., settings, data)``."""

    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())

    format: Literal["vitreg.neuron_set/1"] = FORMAT
    neurons: list[NeuronRow]
    model_spec: str | None = None
    model_family: str | None = None
    n_layers: int | None = Field(None, ge=1, le=100_000)
    d_mlp: int | None = Field(None, ge=1, le=100_000_000)
    fingerprint: str | None = None
    settings: dict[str, JsonValue] = Field(default_factory=dict)
    data: dict[str, JsonValue] = Field(default_factory=dict)

    def __init__(self, *args: Any, **fields: Any) -> None:
        """``NeuronSet(layers, units, scores, model_spec, ..., settings, data)``, positional or
        by name; or ``NAME.json``'s fields by name (as :meth:`load` validates them)."""
        if args or any(k in fields for k in COLUMNS):
            fields = _from_columns(args, fields)
        super().__init__(**fields)

    @property
    def layers(self) -> list[int]:
        return [r.layer for r in self.neurons]

    @property
    def units(self) -> list[int]:
        return [r.unit for r in self.neurons]

    @property
    def scores(self) -> list[float]:
        return [r.score for r in self.neurons]

    def __len__(self) -> int:
        return len(self.neurons)

    @classmethod
    def from_pairs(cls, pairs: Any, model: Any = None, score: float = 1.0) -> NeuronSet:
        """A set of ``(layer, unit)`` pairs, each with ``score`` (e.g. a planted ground truth),
        sized for ``model`` when given."""
        pairs = [(int(layer), int(unit)) for layer, unit in pairs]
        return cls(
            [layer for layer, _ in pairs],
            [unit for _, unit in pairs],
            [score] * len(pairs),
            n_layers=getattr(model, "n_layers", None),
            d_mlp=getattr(model, "d_mlp", None),
        )

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
        scores = self.scores
        return self.pick(sorted(range(len(self)), key=lambda i: -scores[i])[:k])

    def first(self, k: int) -> NeuronSet:
        """The first ``k`` neurons in stored order (a ranking's best; a causal set's first chosen)."""
        return self.pick(list(range(min(k, len(self)))))

    def pick(self, order: list[int]) -> NeuronSet:
        """The neurons at positions ``order``, in that order."""
        return self.model_copy(
            update={
                "neurons": [self.neurons[i] for i in order],
                "settings": {**self.settings, "top_k": len(order)},
                "data": dict(self.data),
            }
        )

    def check_fits(self, model: Any) -> None:
        """Raise if this set was made for another architecture or names units the model lacks."""
        mine = f"{self.model_spec or 'unknown model'} ({self.n_layers} layers, d_mlp {self.d_mlp})"
        theirs = f"{model.spec or type(model.module).__name__} ({model.n_layers} layers, d_mlp {model.d_mlp})"
        if (self.n_layers, self.d_mlp) != (None, None) and (self.n_layers, self.d_mlp) != (
            model.n_layers,
            model.d_mlp,
        ):
            raise InputError(
                f"this NeuronSet was made for {mine} but the model is {theirs}; "
                "run neuron discovery on this model"
            )
        bad = [
            (l_, u)
            for l_, u in self.pairs()
            if not (0 <= l_ < model.n_layers and 0 <= u < model.d_mlp)
        ]
        if bad:
            raise InputError(
                f"NeuronSet names units outside the model {theirs}: {bad[:5]} (made for {mine})"
            )

    def check_applicable(self, model: Any, where: str | None = None) -> None:
        """Raise unless applying this set to ``model`` means something: :meth:`check_fits`, at
        least one neuron, each (layer, unit) once, the settings' detection/highest/lowest layers
        are blocks of the model, ``top_k`` is not larger than the model, and no block has more
        than half of its MLP units named (that is not a set of register neurons).

        An empty set is a valid object (applying it is a no-op), but not something to fix with.
        """
        what = where or f"the NeuronSet for {self.model_spec or 'an unknown model'}"
        if len(self) == 0:
            raise InputError(
                f"{what} names no neurons, so the fix would change nothing; use a set from "
                "`vitreg neurons` (neurons.json) or let `vitreg fix` discover one (no --neurons)"
            )
        self.check_fits(model)
        n_layers, d_mlp = model.n_layers, model.d_mlp
        seen: set[tuple[int, int]] = set()
        twice = [p for p in self.pairs() if p in seen or seen.add(p)]
        if twice:
            raise InputError(f"{what} names the same neuron more than once: {twice[:5]}")
        for key in ("detect_layer", "highest_layer", "lowest_layer"):
            value = self.settings.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_layers:
                raise InputError(
                    f"{what}: settings.{key} is {value!r}, but the model has blocks 0.."
                    f"{n_layers - 1}; the set was made for another model or edited"
                )
        top_k = self.settings.get("top_k")
        if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > n_layers * d_mlp:
            raise InputError(
                f"{what}: settings.top_k is {top_k}, more than the model's {n_layers * d_mlp} "
                "MLP units; the set was made for another model or edited"
            )
        crowded = {b: len(u) for b, u in self.by_layer().items() if len(u) > d_mlp // 2}
        if crowded:
            block, count = next(iter(crowded.items()))
            raise InputError(
                f"{what} names {count} of the {d_mlp} MLP units of block {block}; register "
                "neurons are a few units, and editing most of a block changes the model "
                "rather than fixing it. Use a smaller top-k (e.g. `vitreg neurons --top-k 20`)"
            )

    # persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, JsonValue]:
        """Deprecated: ``NAME.json`` is :meth:`model_dump`."""
        warnings.warn(
            "NeuronSet.to_dict() is now NeuronSet.model_dump() (the set is its file's model); "
            "the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.model_dump()

    @staticmethod
    def files(path: str | Path) -> tuple[Path, Path]:
        """``(NAME.json, NAME.safetensors)`` for either file's path or the stem ``NAME``; the
        name keeps its dots (``set.v1.json`` and ``set.v1`` both give ``set.v1.*``)."""
        p = Path(path)
        base = p.with_suffix("") if p.suffix in SUFFIXES else p
        if not base.name or base.name in (".", ".."):
            raise InputError(f"{str(p)!r} names no NeuronSet file (expected NAME.json)")
        return base.with_name(base.name + ".json"), base.with_name(base.name + ".safetensors")

    def save(self, path: str | Path) -> Path:
        """Write ``path.safetensors`` and ``path.json``; returns the JSON path."""
        from safetensors.torch import save

        meta_path, tensor_path = self.files(path)
        tensors = {
            "layers": torch.tensor(self.layers, dtype=torch.int64),
            "units": torch.tensor(self.units, dtype=torch.int64),
            "scores": torch.tensor(self.scores, dtype=torch.float64),
        }
        write_bytes_atomic(tensor_path, save(tensors, metadata={"format": FORMAT}))
        return write_json_atomic(meta_path, self.model_dump())

    @classmethod
    def load(cls, path: str | Path) -> NeuronSet:
        """Read a set saved by :meth:`save` (either file's path, or the common stem).

        Both files are validated before anything uses them: the JSON's fields and types (every
        neuron ``{layer: int >= 0, unit: int >= 0, score: finite}``, typed settings) and the
        tensors (1-D int64 layers and units, 1-D float scores, equal lengths, equal to the JSON's
        rows). Any problem is an :class:`InputError` naming the file and the field."""
        from vitreg.core.readers import read_json
        from vitreg.models.load import describe_invalid

        meta_path, tensor_path = cls.files(path)
        if not meta_path.is_file():
            raise InputError(
                f"no NeuronSet at {str(meta_path)!r} (expected NAME.json + NAME.safetensors)"
            )
        meta = read_json(meta_path, "NeuronSet file", max_bytes=256 * 2**20, allow_nan=True)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise InputError(
                f"{str(meta_path)!r} is not a vitreg NeuronSet (its 'format' must be {FORMAT!r})"
            )
        try:
            found = cls.model_validate(meta, strict=True)
            _Recorded.model_validate({"settings": found.settings})
        except ValidationError as e:
            raise InputError(describe_invalid(e, meta_path, "NeuronSet file")) from None
        if tensor_path.is_file():
            _check_tensors(tensor_path, found.layers, found.units, found.scores)
        found.settings = _settings(found.settings, meta_path)
        return found


def _check_tensors(path: Path, layers: list[int], units: list[int], scores: list[float]) -> None:
    """``NAME.safetensors`` must hold exactly the JSON's neurons: 1-D int64 ``layers`` and
    ``units``, 1-D float ``scores``, equal lengths, equal values."""
    from safetensors.torch import load_file

    try:
        t = load_file(str(path))
    except Exception as e:
        first = " ".join(str(e).split())[:200]
        raise InputError(
            f"NeuronSet tensors {str(path)!r} cannot be read ({type(e).__name__}: {first}); the "
            "file is truncated or not safetensors (delete it to use the JSON's neurons alone)"
        ) from None
    if set(t) != {"layers", "units", "scores"}:
        raise InputError(
            f"NeuronSet tensors {str(path)!r} hold {sorted(t)}; expected exactly layers, units "
            "and scores"
        )
    for key, kinds in (("layers", "int64"), ("units", "int64"), ("scores", "float")):
        x = t[key]
        ok = x.dtype == torch.int64 if kinds == "int64" else x.is_floating_point()
        if x.ndim != 1 or not ok:
            raise InputError(
                f"NeuronSet tensors {str(path)!r}: {key} is a {x.ndim}-D {x.dtype} tensor; "
                f"expected a 1-D {kinds} tensor"
            )
    n = {k: t[k].numel() for k in t}
    if len(set(n.values())) != 1 or n["layers"] != len(layers):
        raise InputError(
            f"NeuronSet tensors {str(path)!r} hold {n['layers']} layers, {n['units']} units and "
            f"{n['scores']} scores but the JSON lists {len(layers)} neurons; save the set again "
            "(or delete the .safetensors file to use the JSON's neurons)"
        )
    same = t["layers"].tolist() == layers and t["units"].tolist() == units
    close = all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        for a, b in zip(t["scores"].tolist(), scores, strict=True)
    )
    if not (same and close):
        raise InputError(
            f"NeuronSet tensors {str(path)!r} do not match the neurons in the JSON next to it; "
            "one file was edited: save the set again (or delete the .safetensors file to use the "
            "JSON's neurons)"
        )
