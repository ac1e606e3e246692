"""Resumable streaming statistics: inside :func:`resumable`, every streaming pass (``Model.trace``,
neuron discovery) saves its state every ``every`` images, and a rerun of the same work resumes
each pass from its last saved state, ending with the numbers of an uninterrupted run.

Passes are numbered in the order they start (a run's passes are the same, in the same order,
each time it runs); pass ``i`` of rank ``r`` keeps ``pass-{i}.rank{r}.{seen}.json`` +
``.safetensors`` (the state and how many images of the stream it covers, written atomically;
the last two are kept, so a rank that died between two writes still has one its peers share).
A finished pass keeps its final state, and a rerun restores it without reading its images. A
pass's key (its kind, sites, batch size, image limit, world size) must match the saved one:
another run's checkpoint is refused, not used.

States are tensors (``safetensors``) and JSON; objects of vitreg's own classes (e.g. token
layouts) are stored as their module, class and attributes and rebuilt only if the class is
vitreg's. Nothing is pickled. Under torchrun every rank saves its own state (before any merge)
and, on resume, all ranks restart from the largest image count that every rank has saved --
except for sources that split themselves by rank (webdataset shards): there each rank's images
are its own, its counts are positions in the global stream, and it restarts from its own last
state.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeAlias

import torch
import torch.distributed as dist
from pydantic import JsonValue

from vitreg.core.disk import writing
from vitreg.core.io import write_bytes_atomic, write_text_atomic
from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError

KEEP = 2  # saved states kept per pass and rank
#: one value of a pass's state: a tensor, a dtype, a JSON scalar, a token layout (one of vitreg's
#: objects, saved as its attributes), or a list, tuple or dict of such values
Saved: TypeAlias = (
    torch.Tensor
    | torch.dtype
    | TokenLayout
    | str
    | int
    | float
    | bool
    | None
    | list["Saved"]
    | tuple["Saved", ...]
    | dict[str, "Saved"]
    | dict[int, "Saved"]
)
#: a pass's state (or one object's statistics): name -> value
PassState: TypeAlias = dict[str, Saved]
#: what identifies a pass (its kind, sites, batch size, image limit, world size), as JSON
PassKey: TypeAlias = dict[str, JsonValue]
_active: list[Resume] = []


# ---------------------------------------------------------------- encoding states
def encode(obj: Any, tensors: dict[str, torch.Tensor], seen: dict[int, int] | None = None) -> Any:
    """JSON for ``obj`` with its tensors moved into ``tensors`` (see the module docstring). An
    object of vitreg's held in two places (two reducers sharing one accumulator) is stored once
    and referred to after, so that it is shared again when decoded."""
    seen = {} if seen is None else seen
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu().contiguous().clone()
        return {"$t": name}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.dtype):
        return {"$dtype": str(obj).removeprefix("torch.")}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: encode(v, tensors, seen) for k, v in obj.items()}
        return {
            "$d": [[encode(k, tensors, seen), encode(v, tensors, seen)] for k, v in obj.items()]
        }
    if isinstance(obj, list):
        return [encode(v, tensors, seen) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return {"$tuple": [encode(v, tensors, seen) for v in obj]}
    cls = type(obj)
    if cls.__module__.startswith("vitreg.") and hasattr(obj, "__dict__"):
        if id(obj) in seen:
            return {"$ref": seen[id(obj)]}
        seen[id(obj)] = ref = len(seen)
        state = {k: v for k, v in vars(obj).items() if not callable(v)}
        return {
            "$obj": f"{cls.__module__}:{cls.__qualname__}",
            "id": ref,
            "state": encode(state, tensors, seen),
        }
    raise TypeError(f"cannot checkpoint a {cls.__module__}.{cls.__qualname__}")


def decode(obj: Any, tensors: dict[str, torch.Tensor], made: dict[int, Any] | None = None) -> Any:
    """The inverse of :func:`encode` (an object referred to twice is one object again)."""
    made = {} if made is None else made
    if isinstance(obj, list):
        return [decode(v, tensors, made) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "$t" in obj:
        return tensors[obj["$t"]]
    if "$dtype" in obj:
        return getattr(torch, obj["$dtype"])
    if "$d" in obj:
        return {decode(k, tensors, made): decode(v, tensors, made) for k, v in obj["$d"]}
    if "$tuple" in obj:
        return tuple(decode(v, tensors, made) for v in obj["$tuple"])
    if "$ref" in obj:
        ref = obj["$ref"]
        if not isinstance(ref, int) or ref not in made:
            raise InputError(f"checkpoint refers to object {ref!r} before storing it")
        return made[ref]
    if "$obj" in obj:
        module, _, qualname = obj["$obj"].partition(":")
        if not module.startswith("vitreg.") or not re.fullmatch(r"[A-Za-z_][\w.]*", qualname):
            raise InputError(f"checkpoint names a class outside vitreg: {obj['$obj']!r}")
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not isinstance(cls, type):
            raise InputError(f"checkpoint names {obj['$obj']!r}, which is not a class")
        out = cls.__new__(cls)
        if isinstance(obj.get("id"), int):
            made[obj["id"]] = out
        out.__dict__.update(decode(obj["state"], tensors, made))
        return out
    return {k: decode(v, tensors, made) for k, v in obj.items()}


def restore_into(target: Any, state: PassState) -> None:
    """Set ``target``'s attributes from a decoded state (its callables stay as they are)."""
    vars(target).update(state)


def state_of(obj: Any) -> PassState:
    """``obj``'s attributes that are statistics (callables -- readers, modules -- left out)."""
    return {k: v for k, v in vars(obj).items() if not callable(v)}


# ---------------------------------------------------------------- the scope
class Resume:
    """The folder of one resumable run and the number of passes started so far."""

    def __init__(self, folder: Path, every: int) -> None:
        if every < 1:
            raise InputError(f"checkpoint every N images needs N >= 1, got {every}")
        self.folder = folder
        self.every = every
        self.passes = 0

    def next_pass(self, key: PassKey) -> Pass:
        p = Pass(self, self.passes, key)
        self.passes += 1
        return p


@contextmanager
def resumable(
    folder: str | Path, every: int, identity: dict[str, Any] | None = None
) -> Iterator[Resume]:
    """Within the block, streaming passes checkpoint every ``every`` images into ``folder``
    and resume from what is there. ``identity`` (JSON: e.g. a run's resolved config) is kept in
    ``folder/run.json``; a folder kept for another identity is refused."""
    scope = Resume(Path(folder).expanduser(), every)
    with writing(scope.folder):
        scope.folder.mkdir(parents=True, exist_ok=True)
    if identity is not None:
        check_identity(scope.folder / "run.json", identity)
    _active.append(scope)
    try:
        yield scope
    finally:
        _active.pop()


def check_identity(path: Path, identity: dict[str, Any]) -> None:
    """Write ``identity`` to ``path``, or check that the one there is the same."""
    wanted = json.loads(json.dumps(identity, default=str))
    if path.is_file():
        if json.loads(path.read_text()) != wanted:
            raise InputError(
                f"{str(path.parent)!r} holds the checkpoints of another run (other settings or "
                "images); remove it to start afresh"
            )
        return
    rank, _ = _rank_world()
    if rank == 0:
        write_text_atomic(path, json.dumps(wanted, indent=2))


def next_pass(key: PassKey) -> Pass | None:
    """The checkpoint of the next streaming pass of the active :func:`resumable` block (``None``
    outside one: nothing is saved)."""
    return _active[-1].next_pass(key) if _active else None


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Pass:
    """Checkpoints of one streaming pass on this rank."""

    def __init__(self, scope: Resume, index: int, key: PassKey) -> None:
        self.rank, self.world = _rank_world()
        self.scope = scope
        self.index = index
        self.key: PassKey = {**key, "world": self.world}
        self.stem = f"pass-{index}.rank{self.rank}"
        self.saved_at = 0

    def _files(self) -> dict[int, Path]:
        found = {}
        for p in self.scope.folder.glob(f"{self.stem}.*.json"):
            m = re.fullmatch(rf"{re.escape(self.stem)}\.(\d+)\.json", p.name)
            if m:
                found[int(m.group(1))] = p
        return dict(sorted(found.items()))

    def resume(self, together: bool = True) -> tuple[int, bool, PassState | None]:
        """``(images covered, finished, state)`` of the latest state every rank has saved, or
        ``(0, False, None)`` when there is none. ``together=False`` (ranks that each read their
        own images, e.g. webdataset shards split by rank): this rank's latest state, whatever
        the others saved."""
        from safetensors.torch import load_file

        files = self._files()
        metas = {}
        for seen, path in files.items():
            meta = json.loads(path.read_text())
            if meta["key"] != json.loads(json.dumps(self.key)):
                raise InputError(
                    f"checkpoint {str(path)!r} was saved by other work ({meta['key']}, not "
                    f"{self.key}); remove {str(self.scope.folder)!r} to start afresh"
                )
            metas[seen] = meta
        common = set(metas)
        if self.world > 1 and together:
            everyone: list[Any] = [None] * self.world
            dist.all_gather_object(everyone, sorted(metas))
            for other in everyone:
                common &= set(other)
        if not common:
            return 0, False, None
        seen = max(common)
        meta = metas[seen]
        tensors = load_file(str(files[seen].with_suffix(".safetensors")))
        self.saved_at = seen
        return seen, bool(meta["done"]), decode(meta["state"], tensors)

    def step(self, seen: int, state: Callable[[], PassState]) -> None:
        """Save ``state()`` when ``seen`` images have passed another ``every`` since the last."""
        if seen - self.saved_at >= self.scope.every:
            self.save(seen, state(), done=False)

    def save(self, seen: int, state: PassState, done: bool) -> None:
        """Write the state covering ``seen`` images (tensors first, then the JSON that names
        them), then drop all but the last :data:`KEEP` states."""
        from safetensors.torch import save

        tensors: dict[str, torch.Tensor] = {}
        meta = {"key": self.key, "seen": seen, "done": done, "state": encode(state, tensors)}
        base = self.scope.folder / f"{self.stem}.{seen}"
        write_bytes_atomic(f"{base}.safetensors", save(tensors))
        write_text_atomic(f"{base}.json", json.dumps(meta))
        self.saved_at = seen
        for old in list(self._files())[:-KEEP]:
            for suffix in (".json", ".safetensors"):
                (self.scope.folder / f"{self.stem}.{old}{suffix}").unlink(missing_ok=True)
