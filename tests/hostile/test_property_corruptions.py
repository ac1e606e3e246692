"""Seeded random corruptions of every file kind vitreg reads, each run through the entry point
that reads it: the answer is a result (the damage was harmless, or a damaged part was skipped
and counted) or exit 2 / a :class:`~vitreg.errors.VitregError` with a one-paragraph message --
never exit 1 ("this is a bug"), never a file outside the run changed, never longer than the
budget of a case.

A file kind is one entry of :data:`KINDS`: how to write a valid instance, which of its files to
damage, how vitreg reads it and which folder that read may write. The corruptions are bytes
(truncation, flipped bytes, inserted garbage, an empty file, another encoding) and, for JSON and
YAML, values (wrong types, huge numbers, deep nesting, removed keys). Every case is named by its
kind and seed, so a failure reruns alone (``-k 'metrics.json-17'``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import shutil
import signal
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from vitreg.cli.app import app
from vitreg.errors import VitregError

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]
runner = CliRunner()
GOLDEN = Path(__file__).parents[1] / "report" / "_golden"
BUDGET_S = 20  # one case, however hostile its input; the slowest take about a second
MAX_MESSAGE = 3000  # characters of one error paragraph


# ------------------------------------------------------------------------------ corruptions
def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))] if data else data


def _flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= rng.randint(1, 255)
    return bytes(out)


def _insert(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.randbytes(rng.randint(1, 64)) + data[at:]


def _empty(data: bytes, rng: random.Random) -> bytes:
    return b""


def _encoding(data: bytes, rng: random.Random) -> bytes:
    text = data.decode("utf-8", errors="replace") + " é"
    return text.encode(rng.choice(["utf-16", "latin-1", "utf-32"]), errors="replace")


def _repeat(data: bytes, rng: random.Random) -> bytes:
    return data * rng.randint(2, 20)


BYTE_CORRUPTIONS = (_truncate, _flip, _insert, _empty, _encoding, _repeat)


def _hostile_value(rng: random.Random) -> Any:
    """A value of the wrong type or size for almost any field."""
    deep: Any = 0
    for _ in range(rng.choice([10, 70, 300])):
        deep = [deep]
    return rng.choice(
        [
            None, True, -1, 0, 10**400, 1e308, -1e308, float("nan"), float("inf"), "", "x" * 5000,
            "../../../etc/passwd", "a**b", [], {}, [1, "2", None], {"": {"": []}}, deep,
            {f"k{i}": i for i in range(2000)}, "\x00\udcff",
        ]
    )  # fmt: skip


def _nodes(tree: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON-like tree (keys and indices), the root first."""
    yield path
    if isinstance(tree, dict | list):
        for key, child in tree.items() if isinstance(tree, dict) else enumerate(tree):
            yield from _nodes(child, (*path, key))


def _mutate_tree(tree: Any, rng: random.Random) -> Any:
    """``tree`` with one node replaced by a hostile value, or one key removed."""
    paths = list(_nodes(tree))
    path = rng.choice(paths)
    if not path:
        return _hostile_value(rng)
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and rng.random() < 0.25:
        del parent[path[-1]]
    else:
        parent[path[-1]] = _hostile_value(rng)
    return tree


def _dump(tree: Any, kind: str) -> bytes:
    if kind == "yaml":
        try:
            return yaml.safe_dump(tree, allow_unicode=True).encode("utf-8", "surrogatepass")
        except (yaml.YAMLError, RecursionError):
            return json.dumps(tree).encode()  # JSON is YAML too
    return json.dumps(tree).encode("utf-8", "surrogatepass")


def corrupt(path: Path, rng: random.Random, structured: str | None) -> str:
    """Damage ``path`` in place, one way chosen by ``rng``; a word saying how."""
    data = path.read_bytes()
    if structured is not None and rng.random() < 0.5:
        loads = yaml.safe_load if structured == "yaml" else json.loads
        tree = _mutate_tree(loads(data), rng)
        path.write_bytes(_dump(tree, structured))
        return "value"
    how = rng.choice(BYTE_CORRUPTIONS)
    path.write_bytes(how(data, rng))
    return how.__name__.strip("_")


# ------------------------------------------------------------------------------ the checks
class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the case after ``seconds``: a hang fails the case, not the suite."""

    def stop(*_: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def snapshot(root: Path, writable: Path) -> dict[str, str]:
    """Digest of every file under ``root`` outside ``writable`` (the folder the read may write)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and writable not in p.parents:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def one_paragraph(message: str) -> None:
    assert message.strip() and "\n\n" not in message.strip(), message
    assert "Traceback" not in message and len(message) <= MAX_MESSAGE, message[:500]


def cli(*args: str) -> None:
    """``vitreg ARGS`` in process: exit 0, or exit 2 with one ``error:`` paragraph."""
    result = runner.invoke(app, list(args))
    if result.exit_code == 0:
        return
    assert result.exit_code == 2, f"exit {result.exit_code}: {result.output[-1500:]}"
    assert isinstance(result.exception, SystemExit), result.exception
    err = result.stderr.strip()
    assert err.startswith("error:"), result.output[-1500:]
    one_paragraph(err)


def library(call: Callable[[], Any]) -> None:
    """The library call the CLI makes: a result, or a VitregError of one paragraph."""
    try:
        call()
    except VitregError as e:
        one_paragraph(str(e))


# ------------------------------------------------------------------------------ the file kinds
@dataclass(frozen=True)
class Kind:
    """One kind of file vitreg reads: ``make(folder)`` writes a valid instance into ``folder``
    and returns the files to damage; ``read(folder)`` runs vitreg's reader on it; ``writes``:
    the sub-folder that read may write (its run or cache); ``structured``: json/yaml/None;
    ``cases``: seeds in the default run (the slow sweep runs ``SWEEP`` times as many)."""

    make: Callable[[Path], list[Path]]
    read: Callable[[Path], None]
    writes: str = "out"
    structured: str | None = None
    cases: int = 30


def _golden_run(folder: Path, name: str) -> Path:
    run = folder / name
    shutil.copytree(GOLDEN / name, run, ignore=shutil.ignore_patterns("*.py"))
    for companion in ("config.yaml", "report.md", "report.html"):
        if not (run / companion).exists():
            (run / companion).write_text("x")
    return run


def make_metrics(folder: Path) -> list[Path]:
    _golden_run(folder, "train")
    return [_golden_run(folder, "diagnose") / "metrics.json"]


def read_metrics(folder: Path) -> None:
    cli("validate", str(folder / "diagnose"))
    cli("compare", str(folder / "diagnose"), str(folder / "train"))


def make_comparison(folder: Path) -> list[Path]:
    return [_golden_run(folder, "compare") / "comparison.json"]


def read_comparison(folder: Path) -> None:
    cli("validate", str(folder / "compare"))
    cli("compare", str(folder / "compare"))


def make_manifest(folder: Path) -> list[Path]:
    good = _golden_run(folder, "train")
    cli("compare", str(good), "--out", str(folder / "out"))
    return [folder / "out" / ".vitreg-manifest.json"]


def read_manifest(folder: Path) -> None:
    cli("compare", str(folder / "train"), "--out", str(folder / "out"), "--overwrite")


def make_config(folder: Path) -> list[Path]:
    path = folder / "config.yaml"
    doc = json.loads((GOLDEN / "diagnose" / "metrics.json").read_text())["config"]
    path.write_text(yaml.safe_dump({**doc, "out": str(folder / "out")}))
    return [path]


def read_config(folder: Path) -> None:
    from vitreg.configs import load_config

    library(lambda: load_config(folder / "config.yaml", "diagnose"))


def make_neurons(folder: Path) -> list[Path]:
    from vitreg.fix.neuron_set import NeuronSet

    ns = NeuronSet([0, 1], [5, 9], [2.0, 1.0], "timm:x", "vit", 2, 768, None, {"detect_layer": 1})
    return [ns.save(folder / "set.json"), folder / "set.safetensors"]


def read_neurons(folder: Path) -> None:
    from vitreg.fix.neuron_set import NeuronSet

    library(lambda: NeuronSet.load(folder / "set.json"))


CACHE_ARGS = {"views": ("cls", "patch_mean"), "dtype": torch.float32, "shard_size": 3}


def make_cache(folder: Path) -> list[Path]:
    from _support.cache_worker import ToyDataset, small_vit
    from vitreg.probe import extract

    extract(small_vit(), ToyDataset(n=6), root=folder / "cache", **CACHE_ARGS)
    return sorted((folder / "cache").rglob("*.safetensors")) + sorted(
        (folder / "cache").rglob("manifest.json")
    )


def read_cache(folder: Path) -> None:
    from _support.cache_worker import ToyDataset, small_vit
    from vitreg.probe import extract

    def both() -> None:
        cached = extract(small_vit(), ToyDataset(n=6), root=folder / "cache", **CACHE_ARGS)
        assert cached.get("cls", -1).shape[0] == len(cached.keys) == 6

    library(both)


def make_checkpoint(folder: Path) -> list[Path]:
    out = folder / "out"
    model = ["--model-arg", "depth=1", "--model-arg", "embed_dim=64", "--model-arg",
             "num_heads=2", "--model-arg", "patch_size=8", "--img-size", "32"]  # fmt: skip
    args = ["train", "vit_tiny_patch16_224", *model, "--batch-size", "4", "--steps", "1"]
    result = runner.invoke(app, [*args, "--data", "synthetic-cls:n=4,size=32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    found = sorted((out / "checkpoints").glob("step-*"))
    for path in found:  # kept beside the run, read as a resume would
        shutil.move(path, folder / path.name)
    shutil.rmtree(out)
    return sorted(folder.glob("step-*"))


def read_checkpoint(folder: Path) -> None:
    from vitreg.train.checkpoint import load_checkpoint

    library(lambda: load_checkpoint(next(folder.glob("step-*.json"))))


def _png(seed: int) -> bytes:
    from vitreg.testing.images import synthetic_pil

    buf = io.BytesIO()
    synthetic_pil(1, 32, seed=seed)[0].save(buf, format="PNG")
    return buf.getvalue()


def make_shards(folder: Path) -> list[Path]:
    shards = []
    for s in range(2):
        shards.append(folder / f"shard-{s}.tar")
        with tarfile.open(shards[-1], "w") as tar:
            for i in range(3):
                data = _png(3 * s + i)
                info = tarfile.TarInfo(f"{s}{i:03d}.png")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return shards


def read_shards(folder: Path) -> None:
    from vitreg.data import wds

    pattern = f"wds:{folder}/shard-{{0..1}}.tar"

    def both() -> None:
        wds.count_samples(wds.shard_paths(pattern))
        log = wds.FolderLog()
        list(wds.iter_wds(pattern, lambda im: torch.zeros(1), 2, log=log))
        assert len(log.used) + len(log.skipped) >= 1

    library(both)


def make_local(folder: Path) -> list[Path]:
    import timm

    from vitreg.models.loaders.local import save_local

    torch.manual_seed(0)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32)
    save_local(module, folder / "m", depth=1, img_size=32)
    return [folder / "m" / "config.json", folder / "m" / "model.safetensors"]


def read_local(folder: Path) -> None:
    import vitreg

    library(lambda: vitreg.load(f"local:{folder / 'm'}"))


def make_images(folder: Path) -> list[Path]:
    (folder / "images").mkdir()
    for i in range(3):
        (folder / "images" / f"{i}.png").write_bytes(_png(i))
    from vitreg.testing.images import synthetic_pil

    synthetic_pil(1, 32, seed=9)[0].save(folder / "images" / "3.jpg", format="JPEG")
    return sorted((folder / "images").iterdir())


def read_images(folder: Path) -> None:
    from vitreg.data.folder import FolderLog, iter_folder

    def read() -> None:
        log = FolderLog()
        list(iter_folder(folder / "images", lambda im: torch.zeros(1), 2, log=log))
        assert len(log.used) + len(log.skipped) == 4  # every file used or counted

    library(read)


KINDS: dict[str, Kind] = {
    "config.yaml": Kind(make_config, read_config, structured="yaml", cases=40),
    "metrics.json": Kind(make_metrics, read_metrics, structured="json", cases=40),
    "run-manifest": Kind(make_manifest, read_manifest, structured="json", cases=30),
    "comparison.json": Kind(make_comparison, read_comparison, structured="json", cases=20),
    "neuron-set": Kind(make_neurons, read_neurons, structured="json", cases=40),
    "feature-cache": Kind(make_cache, read_cache, writes="cache", cases=12),
    "train-checkpoint": Kind(make_checkpoint, read_checkpoint, structured="json", cases=30),
    "wds-shards": Kind(make_shards, read_shards, cases=30),
    "local-folder": Kind(make_local, read_local, structured="json", cases=30),
    "image-folder": Kind(make_images, read_images, cases=30),
}
SWEEP = 5  # the slow sweep runs this many times the default cases of each kind
DEFAULT = [(k, s) for k, kind in KINDS.items() for s in range(kind.cases)]
SLOW = [(k, s) for k, kind in KINDS.items() for s in range(kind.cases, SWEEP * kind.cases)]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, list]]:
    """A valid instance of each kind, made once; a case copies it."""
    made: dict[str, tuple[Path, list[Path]]] = {}

    def get(name: str) -> tuple[Path, list[Path]]:
        if name not in made:
            folder = tmp_path_factory.mktemp(name.replace(".", "_"))
            made[name] = (folder, KINDS[name].make(folder))
        return made[name]

    return get


def run_case(name: str, seed: int, tmp_path: Path, pristine: Callable) -> None:
    kind = KINDS[name]
    source, targets = pristine(name)
    folder = tmp_path / "case"
    shutil.copytree(source, folder, symlinks=True)
    rng = random.Random(f"{name}-{seed}")
    target = folder / rng.choice(targets).relative_to(source)
    how = corrupt(target, rng, kind.structured if target.suffix in (".json", ".yaml") else None)
    before = snapshot(folder, folder / kind.writes)
    before.pop(str(target.relative_to(folder)), None)  # damaged: a reader may repair its own
    start = time.monotonic()
    try:
        with deadline(BUDGET_S):
            kind.read(folder)
    except (AssertionError, Hang) as e:
        raise AssertionError(f"{name}-{seed} ({how} of {target.name}): {e}") from None
    after = snapshot(folder, folder / kind.writes)
    changed = sorted(k for k in before if before[k] != after.get(k))
    assert not changed, f"{name}-{seed} ({how}): files outside {kind.writes}/ changed: {changed}"
    assert time.monotonic() - start < BUDGET_S


@pytest.mark.parametrize(("name", "seed"), DEFAULT, ids=[f"{k}-{s}" for k, s in DEFAULT])
def test_a_corrupted_file_is_a_result_or_one_paragraph(name, seed, tmp_path, pristine) -> None:
    run_case(name, seed, tmp_path, pristine)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "seed"), SLOW, ids=[f"{k}-{s}" for k, s in SLOW])
def test_the_wider_sweep_of_corruptions(name, seed, tmp_path, pristine) -> None:
    run_case(name, seed, tmp_path, pristine)


def test_every_corruption_changes_the_file(tmp_path: Path) -> None:
    """The generator damages: each byte corruption (and each value mutation) yields other
    bytes than it was given, so no case passes by reading an intact file."""
    data = json.dumps({"a": [1, 2, {"b": "c"}], "d": 1.5}).encode()
    rng = random.Random(0)
    for how in BYTE_CORRUPTIONS:
        for _ in range(20):
            assert how(data, rng) != data, how.__name__
    path = tmp_path / "x.json"
    for seed in range(50):
        path.write_bytes(data)
        corrupt(path, random.Random(seed), "json")
        assert path.read_bytes() != data, seed


def test_the_checks_catch_a_bug_a_hang_and_a_long_message() -> None:
    """What a case asserts can fail: an exception that is not vitreg's (exit 1 on the CLI), a
    read that does not end, a message of several paragraphs."""

    def bug() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        library(bug)

    def two_paragraphs() -> None:
        raise VitregError("first\n\nsecond")

    with pytest.raises(AssertionError):
        library(two_paragraphs)
    with pytest.raises(Hang), deadline(0.2):
        time.sleep(5)
    with pytest.raises(AssertionError, match="Usage"):  # typer's usage error is not vitreg's
        cli("no-such-verb")
