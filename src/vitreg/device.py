"""The ``--device`` check every verb runs before a model loads: a torch device that exists on
this machine and can hold data (not ``meta``), so a wrong one is a one-line error, not a
traceback from deep inside torch."""

from __future__ import annotations

import torch

from vitreg.errors import InputError

USABLE = ("cpu", "cuda", "mps")


def device_problem(device: str) -> str | None:
    """Why ``device`` cannot run vitreg here (None when it can)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        return "is not a torch device; use cpu, cuda, cuda:N or mps"
    if dev.type == "meta":
        return "meta tensors hold no data, so nothing can be computed on them; use cpu or cuda"
    if dev.type not in USABLE:
        return f"{dev.type} devices are not supported by vitreg; use {', '.join(USABLE)}"
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            build = torch.version.cuda or "none"
            return (
                f"no CUDA device is available on this machine (torch CUDA build: {build}); use cpu"
            )
        if dev.index is not None and dev.index >= n:
            return f"this machine has {n} CUDA device(s), cuda:0 to cuda:{n - 1}"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return "MPS (Apple GPU) is not available on this machine; use cpu"
    return None


def check_device(device: str | torch.device | None) -> None:
    """Raise :class:`InputError` naming ``--device`` when ``device`` cannot be used here."""
    if device is None:
        return
    problem = device_problem(str(device))
    if problem is not None:
        raise InputError(f"--device {str(device)!r}: {problem}")
