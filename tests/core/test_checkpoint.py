"""Resumable streaming statistics: a run killed mid-way (a progress callback raising after some
batches) and run again in the same checkpoint folder ends with the numbers of an uninterrupted
run -- diagnose's trace and the neuron search's survey and discovery."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from vitreg.core.checkpoint import decode, encode, resumable
from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError


class Killed(Exception):
    """What the test's progress callback raises to stop a run."""


def killer(after: int) -> Any:
    def progress(n: int) -> None:
        if n >= after:
            raise Killed(n)

    return progress


@pytest.fixture(scope="module")
def model() -> Any:
    from vitreg.models.load import load

    torch.manual_seed(0)
    return load("planted:dinov2_s14", img_size=56)


def source(model: Any, n: int = 12) -> Any:
    from vitreg.data.images import synthetic_source

    return synthetic_source(model, n=n, batch_size=4)


def test_states_encode_without_pickle() -> None:
    layout = TokenLayout(n_cls=1, n_reg=0, n_extra=1, grid=(2, 3), patch_size=(14, 14))
    state = {"rows": {3: torch.arange(4), 0: torch.ones(2)}, "grid": (2, 3), "lay": layout}
    state["plain"] = {"a": [1, 2.5, None, "x"], "dtype": torch.float16}
    tensors: dict[str, torch.Tensor] = {}
    doc = json.loads(json.dumps(encode(state, tensors)))
    back = decode(doc, tensors)
    assert back["lay"] == layout and back["grid"] == (2, 3) and back["plain"] == state["plain"]
    assert list(back["rows"]) == [3, 0] and torch.equal(back["rows"][3], torch.arange(4))
    with pytest.raises(InputError, match="outside vitreg"):
        decode({"$obj": "os:system", "state": {}}, {})
    with pytest.raises(TypeError, match="cannot checkpoint"):
        encode(object(), {})


@pytest.mark.slow
def test_an_object_two_reducers_share_is_shared_again_after_a_restore() -> None:
    """The sink analysis's two halves of a block (hook_v and hook_pattern) fill one accumulator:
    restored from a checkpoint they must fill one again, or every image after the restore is
    lost (neither half ever sees the other's tensor)."""
    from vitreg.analysis.sinks import _Pair

    pair = _Pair(torch.eye(2))
    pair.rows.append((0, torch.ones(2)))
    tensors: dict[str, torch.Tensor] = {}
    saved = json.loads(json.dumps(encode([{"pair": pair}, {"pair": pair}], tensors)))
    first, second = decode(saved, tensors)
    assert first["pair"] is second["pair"] and first["pair"] is not pair
    assert torch.equal(first["pair"].rows[0][1], torch.ones(2))
    with pytest.raises(InputError, match="refers to object"):
        decode([{"$ref": 3}], {})


def test_a_killed_diagnose_resumes_to_the_same_numbers(tmp_path: Path, model: Any) -> None:
    from vitreg.analysis.diagnose import diagnose

    def summary(found: Any) -> str:
        from vitreg.results.schema import plain

        kept = {"model": found.model, "data": found.data, "results": found.results}
        return json.dumps(plain(kept), sort_keys=True)

    whole = summary(diagnose(model, source(model), batch_size=4, max_maps=2))
    folder = tmp_path / "resume"
    with resumable(folder, every=4), pytest.raises(Killed):
        diagnose(model, source(model), batch_size=4, max_maps=2, progress=killer(8))
    saved = sorted(p.name for p in folder.glob("*.json"))
    assert saved == ["pass-0.rank0.4.json", "pass-0.rank0.8.json"]
    done: list[int] = []
    with resumable(folder, every=4):
        again = diagnose(model, source(model), batch_size=4, max_maps=2, progress=done.append)
    assert done == [12]  # only the last batch ran
    assert summary(again) == whole
    with resumable(folder, every=4):  # finished: restored, nothing runs
        third = diagnose(model, source(model), batch_size=4, max_maps=2, progress=done.append)
    assert done == [12] and third.data.n_images == 12
    assert summary(third) == whole


def test_a_killed_trace_resumes_to_the_same_statistics(tmp_path: Path, model: Any) -> None:
    from vitreg.hooks.reducers import Max, Mean, TokenNorms

    def reducers() -> list[Any]:
        site = "blocks.3.hook_resid_post"
        return [TokenNorms(site), Mean(site, of="norm"), Max("blocks.3.mlp.hook_post")]

    whole = model.trace(source(model), reducers(), batch_size=4)
    with resumable(tmp_path, every=4), pytest.raises(Killed):
        model.trace(source(model), reducers(), batch_size=4, progress=killer(8))
    done: list[int] = []
    with resumable(tmp_path, every=4):
        again = model.trace(source(model), reducers(), batch_size=4, progress=done.append)
    assert done == [12] and again.n_images == whole.n_images == 12
    assert again.layouts == whole.layouts
    for a, b in zip(again.reducers, whole.reducers, strict=True):
        assert equal(a.result(), b.result()), type(a).__name__


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_other_work_is_refused(tmp_path: Path, model: Any) -> None:
    from vitreg.hooks.reducers import Mean

    with resumable(tmp_path, every=4):
        model.trace(source(model, 4), [Mean("blocks.1.hook_resid_post")], batch_size=4)
    with resumable(tmp_path, every=4), pytest.raises(InputError, match="other work"):
        model.trace(source(model, 4), [Mean("blocks.2.hook_resid_post")], batch_size=4)
    with pytest.raises(InputError, match="N >= 1"), resumable(tmp_path, every=0):
        pass


class KillIn:
    """Progress that raises once the phase whose label starts with ``label`` reaches ``after``."""

    def __init__(self, label: str = "", after: int = 1 << 30) -> None:
        self.label, self.after = label, after
        self.seen: list[tuple[str, int]] = []

    def __call__(self, total: int | None, label: str) -> Any:
        from contextlib import nullcontext

        def update(done: int, **status: object) -> None:
            self.seen.append((label, done))
            if self.label and label.startswith(self.label) and done >= self.after:
                raise Killed(label)

        return nullcontext(update)

    def note(self, message: str) -> None:
        return None


@pytest.mark.slow
def test_a_killed_neuron_search_resumes_to_the_same_set(tmp_path: Path) -> None:
    from vitreg.data.images import synthetic_source
    from vitreg.models.load import load
    from vitreg.neurons.auto import find_neurons

    torch.manual_seed(0)
    planted = load("planted:dinov2_s14", img_size=112)

    def run(progress: Any) -> Any:
        images = synthetic_source(planted, n=16, batch_size=4)
        return find_neurons(planted, images, n_images=16, batch_size=4, progress=progress)

    whole = run(KillIn()).model_dump()
    folder = tmp_path / "resume"
    with resumable(folder, every=4), pytest.raises(Killed):  # the survey done, discovery not
        run(KillIn("discovering", after=8))
    assert any(p.name.startswith("pass-0.") for p in folder.iterdir())  # the survey's trace
    last = KillIn()
    with resumable(folder, every=4):
        again = run(last).model_dump()
    assert json.dumps(again, sort_keys=True, default=str) == json.dumps(
        whole, sort_keys=True, default=str
    )
    discovery = [done for label, done in last.seen if label.startswith("discovering")]
    assert discovery and min(discovery) > 8  # discovery resumed after its saved images
    passes = {p.name.split(".")[0] for p in folder.glob("*.json")}
    assert {"pass-0", "pass-1"} <= passes  # the survey's trace and discovery, at least
