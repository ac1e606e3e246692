"""Webdataset shards as an image source: ``--images wds:PATTERN`` (e.g.
``wds:/data/train-{000000..000099}.tar``), read through the ``webdataset`` package.

Order: the shards in the order the brace pattern expands to, the samples of each shard in tar
order -- the same images in the same order as a folder holding them under sorted names. A
sample's first member with an image suffix (``.jpg``, ``.png``, ...) is its image; samples with
none, or whose image cannot be decoded, is over the pixel budget or has no faithful RGB version,
are skipped and listed with the reason, exactly as a folder's files are (see
:mod:`vitreg.data.folder`); conversions are listed too. Names in the listing are
``SHARD/KEY.EXT``.

Under torchrun the shards are split by rank the way webdataset's ``split_by_node`` does it:
rank ``r`` of ``w`` reads shards ``r, r + w, r + 2w, ...`` and no other (within a rank,
``split_by_worker`` splits them again between DataLoader workers; with the one in-process
reader used here that is the identity). Every image must still land at its single-process
index, and which images a shard keeps is known only once they are decoded, so a split pass has
two steps (:class:`ShardParts`):

1. **Check**: each rank decodes the images of its own shards and notes, per shard, which samples
   it keeps and the skip/convert listing; one ``all_gather`` (one per round of ``w`` shards when
   an image limit may stop early) gives every rank every shard's counts. From them every rank
   computes the global index of each shard's first image, the exact image count and the merged
   listing in shard order -- the folder's, entry for entry.
2. **Forward**: each rank decodes its kept images again, transforms them and hands them out in
   batches of ``ceil(batch_size / w)`` that never cross a shard (so each batch's images have
   consecutive global indices), each with the global index of its first image
   (:func:`vitreg.distributed.split`). Ranks may have different numbers of batches: nothing
   collective happens in this step, and checkpoints resume each rank from its own state.

A rank thus decodes its own images twice and never the others' (reading every shard on every
rank, as before, decoded each image ``w`` times on ``w`` ranks). With fewer shards than ranks
some ranks would have nothing to do: the source then falls back to every rank reading every
shard and forwarding its part of each global batch (:func:`vitreg.distributed.shard`) and says
so (:meth:`ShardSource.split_note`, a notice of the run). Inside ``distributed.local()`` and on
one process the shards are simply read in order.

Only local shard files are read: ``pipe:`` and URLs are refused (``pipe:`` runs a shell
command, which a data argument must never do).
"""

from __future__ import annotations

import io
import re
import tarfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from vitreg import distributed
from vitreg.data.folder import (
    DECODE_ERRORS,
    IMAGE_SUFFIXES,
    MAX_PIXELS,
    FolderLog,
    PixelBudgetError,
    decoded_batches,
    skip_reason,
    to_rgb,
)
from vitreg.data.images import ImageSource
from vitreg.errors import InputError, brief

PREFIX = "wds:"


def is_wds(images: str | Path | None) -> bool:
    """Whether an ``--images`` value names webdataset shards (``wds:PATTERN``)."""
    return images is not None and str(images).startswith(PREFIX)


MAX_SHARDS = 1_000_000  # names one pattern may expand to; the largest public sets hold ~10^5
MAX_PATTERN = 4096  # characters of a pattern (its nesting bounded with it)
REMOTE = re.compile(r"^(pipe:|[A-Za-z][A-Za-z0-9+.-]+:/)")  # a URL with its // collapsed too
RANGE = re.compile(r"^(-?\d+|[^\d])\.\.(-?\d+|[^\d])(?:\.\.(-?\d+))?$")


def _close(pattern: str, start: int) -> int | None:
    """Index of the ``}`` matching the ``{`` at ``start`` (backslash escapes skipped), or None."""
    depth, i = 0, start
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        depth += (c == "{") - (c == "}")
        if depth == 0:
            return i
        i += 1
    return None


def _split_top(inner: str) -> list[str]:
    """``inner`` split at its commas outside nested braces (backslash escapes kept)."""
    parts, depth, i, last = [], 0, 0, 0
    while i < len(inner):
        c = inner[i]
        if c == "\\":
            i += 2
            continue
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            parts.append(inner[last:i])
            last = i + 1
        i += 1
    return [*parts, inner[last:]]


def _range_size(inner: str) -> int | None:
    """How many names a ``{a..b}`` or ``{a..b..step}`` range gives, or None if it is not one."""
    m = RANGE.match(inner)
    if m is None:
        return None
    a, b, step = m.group(1), m.group(2), abs(int(m.group(3) or 1)) or 1
    if a.lstrip("-").isdigit() != b.lstrip("-").isdigit():
        return None
    lo, hi = (int(a), int(b)) if a.lstrip("-").isdigit() else (ord(a), ord(b))
    return abs(hi - lo) // step + 1


def expansion_size(pattern: str) -> int:
    """How many names the brace pattern expands to, counted without expanding it (an upper
    bound where braceexpand keeps a brace group literal)."""
    total, i = 1, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        end = _close(pattern, i) if c == "{" else None
        if end is None:
            i += 1
            continue
        inner = pattern[i + 1 : end]
        parts = _split_top(inner)
        if len(parts) > 1:
            total *= sum(expansion_size(part) for part in parts)
        else:
            total *= _range_size(inner) or expansion_size(inner)
        i = end + 1
    return total


def shard_paths(images: str | Path) -> list[Path]:
    """The shard files ``wds:PATTERN`` names, brace-expanded in order; each must be a local file.
    The expansion is counted before it is built: at most :data:`MAX_SHARDS` names."""
    try:
        import webdataset  # noqa: F401
        from braceexpand import braceexpand  # installed with webdataset
    except ImportError:
        raise InputError(
            f"--images {images} reads webdataset shards: pip install 'vitreg[wds]'"
        ) from None
    pattern = str(images)[len(PREFIX) :]
    if not pattern:
        raise InputError(
            "--images wds: needs a shard pattern, e.g. wds:/data/train-{0000..0099}.tar"
        )
    if REMOTE.match(pattern) or "://" in pattern:
        raise InputError(
            f"--images {brief(str(images))}: remote shards are not read (no pipe: commands or "
            "URLs, which would run a command or reach the network); download the shards and "
            "pass their local pattern"
        )
    if len(pattern) > MAX_PATTERN or pattern.count("{") > MAX_PATTERN // 64:
        raise InputError(
            f"--images wds: the pattern is {len(pattern):,} characters with "
            f"{pattern.count('{'):,} brace groups; a shard pattern is far shorter"
        )
    n = expansion_size(pattern)
    if n > MAX_SHARDS:
        raise InputError(
            f"--images {brief(str(images))} expands to {n:,} shard names, more than the "
            f"{MAX_SHARDS:,} vitreg reads from one pattern; check the ranges in its braces"
        )
    try:
        paths = [Path(p).expanduser() for p in braceexpand(pattern)]
    except ValueError as e:  # unbalanced braces
        raise InputError(f"--images {brief(str(images))}: {e}; balance its braces") from None
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise InputError(f"--images {brief(str(images))}: shard file(s) not found: {shown}")
    return paths


# tar members that are not regular files: never read, counted as skipped with the reason
SPECIAL_MEMBERS = (
    (tarfile.TarInfo.issym, "a symbolic link"),
    (tarfile.TarInfo.islnk, "a hard link"),
    (tarfile.TarInfo.ischr, "a character device"),
    (tarfile.TarInfo.isblk, "a block device"),
    (tarfile.TarInfo.isfifo, "a FIFO"),
)


def special_members(path: Path) -> list[tuple[str, str]]:
    """``(SHARD/MEMBER, reason)`` for every member of the shard that is a link, a device or a
    FIFO (folders are structure, not members)."""
    try:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
    except (tarfile.TarError, OSError) as e:
        raise InputError(f"shard {str(path)!r} is not a readable tar file ({e})") from None
    out = []
    for m in members:
        kind = next((what for test, what in SPECIAL_MEMBERS if test(m)), None)
        if kind is not None:
            out.append(
                (f"{path.name}/{m.name}", f"{kind} in the shard; only regular files are read")
            )
    return out


def _suffix(key: str) -> str:
    return "." + key.rsplit(".", 1)[-1].lower()


def decode_bytes(
    data: bytes, name: str, max_pixels: int = MAX_PIXELS
) -> tuple[Image.Image, str | None]:
    """Decode one image held in memory (``name`` for messages) and convert it to 8-bit RGB, with
    the checks and errors of :func:`vitreg.data.folder.load_image` (the pixel budget first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data))
        except Image.UnidentifiedImageError:
            raise Image.UnidentifiedImageError(f"cannot identify image file {name!r}") from None
        except Image.DecompressionBombError:
            raise PixelBudgetError(
                "refused by Pillow as a decompression bomb", -1, max_pixels
            ) from None
        with img:
            w, h = img.size
            if w * h > max_pixels:
                raise PixelBudgetError(
                    f"declares {w}×{h} = {w * h:,} pixels, above the budget of {max_pixels:,}",
                    w * h,
                    max_pixels,
                )
            img.load()
            return to_rgb(img)


def iter_samples(paths: list[Path]) -> Iterator[dict[str, str | bytes]]:
    """Webdataset samples of ``paths``, undecoded: ``__key__`` and ``__url__`` (text) and the
    bytes of each member of that key, by suffix; in order, not shuffled (the caller chooses the
    shards, see the module docstring)."""
    import webdataset as wds

    dataset = wds.WebDataset(
        [str(p) for p in paths],
        shardshuffle=False,
        nodesplitter=lambda src: src,  # ShardParts splits the shards by rank itself
        workersplitter=wds.split_by_worker,
        empty_check=False,
    )
    yield from dataset


Decode = Callable[[], tuple[Image.Image, str | None]]


def sample_entry(
    sample: dict[str, str | bytes], max_pixels: int = MAX_PIXELS
) -> tuple[str, Decode | None, str]:
    """``(name, decode, "")`` for a sample with an image member, ``(name, None, why)`` for one
    without (its name is then ``SHARD/KEY``)."""
    base = f"{Path(str(sample['__url__'])).name}/{sample['__key__']}"
    members = [k for k in sample if not k.startswith("__")]
    image_keys = [k for k in members if _suffix(k) in IMAGE_SUFFIXES]
    if not image_keys:
        listed = ", ".join(sorted(members)) or "nothing"
        return base, None, f"no image member in the sample (has {listed})"
    name, data = f"{base}.{image_keys[0]}", sample[image_keys[0]]
    return name, lambda: decode_bytes(data, name, max_pixels), ""


def iter_wds(
    images: str | Path,
    transform: Callable[[Image.Image], torch.Tensor],
    batch_size: int = 32,
    limit: int | None = None,
    log: FolderLog | None = None,
    max_pixels: int = MAX_PIXELS,
) -> Iterator[torch.Tensor]:
    """Batches of transformed images from the shards of ``wds:PATTERN``; ``log`` records used,
    converted and skipped samples as for a folder."""
    log = log if log is not None else FolderLog()

    def entries() -> Iterator[tuple[str, Decode]]:
        for path in shard_paths(images):
            if limit is not None and len(log.used) >= limit:
                return
            log.skipped.update(special_members(path))
            for sample in iter_samples([path]):
                if limit is not None and len(log.used) >= limit:
                    return
                name, decode, why = sample_entry(sample, max_pixels)
                if decode is None:
                    log.skipped[name] = why
                    continue
                yield name, decode

    yield from decoded_batches(entries(), transform, batch_size, log, str(images))


# ---------------------------------------------------------------- split by rank
@dataclass
class ShardCheck:
    """What decoding one shard found: the positions (among its samples) of the images kept, and
    its listing in sample order, ``(name, skip reason, conversion)`` per sample."""

    kept: list[int] = field(default_factory=list)
    events: list[tuple[str, str | None, str | None]] = field(default_factory=list)


def check_shard(path: Path, max_pixels: int = MAX_PIXELS) -> ShardCheck:
    """Decode every image of one shard (none is kept in memory) to learn which are used."""
    check = ShardCheck()
    check.events.extend((name, why, None) for name, why in special_members(path))
    for position, sample in enumerate(iter_samples([path])):
        name, decode, why = sample_entry(sample, max_pixels)
        if decode is None:
            check.events.append((name, why, None))
            continue
        try:
            _, note = decode()
        except DECODE_ERRORS as e:
            check.events.append((name, skip_reason(e), None))
            continue
        check.events.append((name, None, note))
        check.kept.append(position)
    return check


@dataclass
class Plan:
    """Where every shard's images go in the global order, from every shard's check: ``first[s]``
    is the global index of shard ``s``'s first image, ``take[s]`` how many of its kept images
    are used (fewer under an image limit), ``log`` the merged listing."""

    first: dict[int, int]
    take: dict[int, int]
    total: int
    log: FolderLog


def plan_of(checks: dict[int, ShardCheck], limit: int | None) -> Plan:
    """Replay every shard's listing in shard order exactly as the one-process reader records it
    (it stops looking once ``limit`` images are used)."""
    log = FolderLog()
    first: dict[int, int] = {}
    take: dict[int, int] = {}
    for s in sorted(checks):
        first[s], take[s] = len(log.used), 0
        for name, skipped, note in checks[s].events:
            if limit is not None and len(log.used) >= limit:
                break
            if skipped is not None:
                log.skipped[name] = skipped
                continue
            if note is not None:
                log.converted[name] = note
            log.used.append(name)
            take[s] += 1
    return Plan(first, take, len(log.used), log)


class ShardParts:
    """One rank's images of a :class:`ShardSource` split by rank (see the module docstring):
    iterating checks the shards (collectively, before the first part), then yields
    ``(global index of the first image, images)`` for this rank's shards only."""

    def __init__(self, source: ShardSource, rank: int, world: int, limit: int | None) -> None:
        self.source = source
        self.rank = rank
        self.world = world
        self.limit = limit
        self.total = 0

    def _checks(self) -> dict[int, ShardCheck]:
        """Every shard's check, this rank's decoded here and the others' gathered, in rounds of
        ``world`` shards while an image limit may end the pass early (one round without); the
        same rounds on every rank, so the gathers always meet."""
        checks, paths = self.source.checks, self.source.paths
        step = self.world if self.limit is not None else len(paths)
        for start in range(0, len(paths), step):
            if self.limit is not None and sum(len(checks[s].kept) for s in range(start)) >= (
                self.limit
            ):
                break  # the shards before this round hold enough images
            mine: dict[int, ShardCheck | str] = {}
            for s in range(start, min(len(paths), start + step)):
                if s % self.world == self.rank and s not in checks:
                    # any error goes through the gather: raised here alone, it would leave the
                    # other ranks waiting in it
                    try:
                        mine[s] = check_shard(paths[s], self.source.max_pixels)
                    except Exception as e:  # noqa: BLE001
                        mine[s] = f"{type(e).__name__}: {e}"
            for part in distributed.all_gather(mine):
                for s, found in part.items():
                    if isinstance(found, str):
                        raise InputError(f"shard {str(paths[s])!r} could not be read ({found})")
                    checks[s] = found
        return checks

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        src = self.source
        plan = plan_of(self._checks(), self.limit)
        src.adopt(plan)
        self.total = plan.total
        if plan.total == 0:
            raise InputError(
                f"no readable image in {src.images}; skipped: "
                + "; ".join(f"{k}: {v}" for k, v in list(plan.log.skipped.items())[:5])
            )
        per_rank = -(-src.batch_size // self.world)
        for s in range(self.rank, len(src.paths), self.world):
            if not plan.take.get(s):
                continue
            kept = src.checks[s].kept[: plan.take[s]]
            wanted = set(kept)
            start, batch = plan.first[s], []
            for position, sample in enumerate(iter_samples([src.paths[s]])):
                if position > kept[-1]:
                    break
                if position not in wanted:
                    continue
                _, decode, _ = sample_entry(sample, src.max_pixels)
                assert decode is not None  # the check kept it
                img, _ = decode()
                batch.append(src.model.transform(img))
                if len(batch) == per_rank:
                    yield start, torch.stack(batch)
                    start, batch = start + len(batch), []
            if batch:
                yield start, torch.stack(batch)


class ShardSource(ImageSource):
    """The images of ``wds:PATTERN`` for one model: read in order when iterated, split by rank
    under torchrun (:meth:`rank_parts`, see the module docstring)."""

    def __init__(
        self,
        model: Any,
        images: str | Path,
        paths: list[Path],
        batch_size: int,
        limit: int | None,
        keep: int,
        max_pixels: int,
    ) -> None:
        self.images = str(images)
        self.paths = paths
        self.batch_size = batch_size
        self.limit = limit
        self.max_pixels = max_pixels
        self.checks: dict[int, ShardCheck] = {}  # every shard checked so far, on every rank
        self._split = False
        log = FolderLog()

        def batches() -> Iterator[torch.Tensor]:
            self._split = False
            for record in (log.used, log.converted, log.skipped):  # a fresh record per pass
                record.clear()
            yield from iter_wds(images, model.transform, batch_size, limit, log, max_pixels)

        pattern = self.images[len(PREFIX) :]
        desc = {
            "source": "webdataset",
            "description": f"the webdataset shards {pattern} ({len(paths)} shards)",
            "path": pattern,
            "n_shards": len(paths),  # the pattern names them; a list of 10k paths would not help
            "synthetic": False,
            "max_pixels": max_pixels,
        }
        n = count_samples(paths)
        super().__init__(model, batches, desc, min(n, limit) if limit else n, keep, log)

    def split_note(self, world: int) -> str | None:
        """Why ``world`` ranks cannot split these shards by rank (``None`` when they can)."""
        if world <= 1 or len(self.paths) >= world:
            return None
        return (
            f"{len(self.paths)} shard(s) for {world} torchrun ranks: the shards are not split by "
            "rank (a rank would have none); every rank reads them all and forwards its part of "
            "each batch. Write at least as many shards as ranks to split them"
        )

    def rank_parts(self, rank: int, world: int, limit: int | None = None) -> ShardParts | None:
        """This rank's images, split by shard; ``None`` with fewer shards than ranks."""
        if self.split_note(world) is not None:
            return None
        limits = [n for n in (limit, self.limit) if n is not None]
        return ShardParts(self, rank, world, min(limits) if limits else None)

    def adopt(self, plan: Plan) -> None:
        """Take the counts and listing of a split pass (every rank's images, not this rank's)."""
        assert self.log is not None
        self.log.used[:] = plan.log.used
        self.log.converted.clear()
        self.log.converted.update(plan.log.converted)
        self.log.skipped.clear()
        self.log.skipped.update(plan.log.skipped)
        self.n_images = plan.total
        self._shown = []
        self._split = True

    def display_images(self) -> torch.Tensor | None:
        """The first ``keep`` images, as for any source; after a split pass (whose first images
        may be another rank's) they are read again from the first shards."""
        if self._split and not self._shown and self.keep:
            first = iter_wds(
                self.images, self.model.transform, self.keep, self.keep, None, self.max_pixels
            )
            self._shown = list(next(first).float())
        return super().display_images()


def count_samples(paths: list[Path]) -> int:
    """How many samples the shards hold, from their tar headers (no image is decoded)."""
    from webdataset.tariterators import base_plus_ext

    keys = 0
    for path in paths:
        try:
            with tarfile.open(path) as tar:
                names = [m.name for m in tar.getmembers() if m.isfile()]
        except (tarfile.TarError, OSError) as e:
            raise InputError(f"shard {str(path)!r} is not a readable tar file ({e})") from None
        keys += len({base_plus_ext(n)[0] for n in names} - {None})
    return keys


def wds_images(
    model: Any,
    images: str | Path,
    batch_size: int = 32,
    limit: int | None = None,
    keep: int = 8,
    max_pixels: int = MAX_PIXELS,
) -> ShardSource:
    """Every readable image of the shards ``wds:PATTERN`` names, as an image source for ``model``;
    missing shards, or a pattern that is not local files, raise :class:`InputError` here."""
    return ShardSource(model, images, shard_paths(images), batch_size, limit, keep, max_pixels)
