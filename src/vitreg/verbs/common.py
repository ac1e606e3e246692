"""What every verb shares: the default model, run-directory names, the reproducing command
line, joining torchrun, and reading back the document a run wrote."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from vitreg.configs import DEFAULT_SPEC
from vitreg.verbs.result import Notice, Notices


def slug(spec: str) -> str:
    """A file-name-safe form of a model spec: ``planted:dinov2_s14`` -> ``planted-dinov2_s14``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-.").lower() or "model"


def default_run_dir(name: str, root: Path = Path("runs"), verb: str = "diagnose") -> Path:
    """``runs/<timestamp>_<name>_<verb>``, with a numeric suffix if that exists already."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{stamp}_{name}_{verb}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


#: a command-line option's value: a flag, a value, or numbers joined by commas (None: left out)
OptionValue = str | int | float | bool | Path | Sequence[str | int | float] | None


def command_line(spec: str | None, options: dict[str, OptionValue], verb: str = "diagnose") -> str:
    """The command line that reproduces the run of ``spec`` (none: the models are among the
    options; options left unset are omitted)."""
    parts = ["vitreg", verb, *([spec] if spec is not None else [])]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, list | tuple):  # numbers, comma-separated (--check-sizes 112,336)
            parts += [flag, ",".join(map(str, value))] if value else []
        elif value not in (None, False):
            parts += [flag, str(value)]
    return shlex.join(parts)


def rerun_command(cfg: Any, spec: str) -> str:
    """The command line of a typed model config: every field but the spec that differs from its
    default, as options (a default is what the command does unasked, and some verbs have no
    option for a field they share, e.g. ``fix`` and ``--top-k``)."""
    fields = type(cfg).model_fields
    options = {
        k: v
        for k, v in cfg.model_dump().items()
        if k != "spec" and v != fields[k].get_default(call_default_factory=True)
    }
    return command_line(spec, options, cfg.verb)


def demo_notice(what: str) -> Notice:
    """The notice that no model was given, so the synthetic demo runs (``what`` it has)."""
    return Notice(
        "demo",
        f"No model given: running the embedded demo, {DEFAULT_SPEC}, a synthetic ViT with "
        f"{what}. Pass a SPEC (see `vitreg models`) for a real model.",
        caution=True,
    )


def images_named(cfg: Any) -> str:
    """The images a model verb runs on, in words: the folder, the sample photos or synthetic."""
    if getattr(cfg, "images", None) is not None:
        return f"the images in {cfg.images}"
    return "the bundled sample photos" if getattr(cfg, "samples", False) else "synthetic images"


def prepare(cfg: Any, notices: Notices, demo: str | None = None) -> tuple[Any, str]:
    """``cfg`` with its spec (the demo model when none; with ``demo``, what the demo has, said
    in a notice) and its run directory (default ``runs/<time>_<model>_<verb>``, checked before
    any model loads) filled in, and the command line that reproduces the run."""
    from vitreg.core.out_dir import check_out

    if cfg.spec is None and demo is not None:
        notices.append(demo_notice(demo))
    spec = cfg.spec or DEFAULT_SPEC
    run_dir = cfg.out if cfg.out is not None else default_run_dir(slug(spec), verb=cfg.verb)
    check_out(run_dir, cfg.verb, spec, cfg.overwrite)
    cfg = cfg.model_copy(update={"spec": spec, "out": run_dir})
    return cfg, rerun_command(cfg, spec)


def join_torchrun(device: str | None) -> str | None:
    """Under torchrun (``WORLD_SIZE > 1``) join the process group (gloo on CPU, NCCL on GPUs);
    the device this rank runs on: ``cuda:LOCAL_RANK`` when none is given on GPUs, else
    ``device`` unchanged. Every rank then runs the verb on the same images; the library shards
    the forward passes and merges the statistics, and only rank 0 writes files."""
    from vitreg import distributed

    if not distributed.under_torchrun():
        return device
    ctx = distributed.setup(device)
    return str(ctx.device) if device is None and ctx.device.type == "cuda" else device
