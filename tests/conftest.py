"""Shared fixtures: small, exact timm architectures with random weights; never the network."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# CLI tests read stderr's error paragraph alone; tests/test_cli_progress.py turns progress on
os.environ.setdefault("VITREG_PROGRESS", "off")
# the cores shared among pytest-xdist workers (one worker: all of them, up to 2 as before)
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 2) // WORKERS)))

TESTS = Path(__file__).resolve().parent  # helper modules and worker scripts live in _support/
ROOT = TESTS.parent  # the repository
# a bound on any child process, only to stop a hung test: a loaded machine never reaches it
HANG_GUARD_S = 1800


def free_port() -> int:
    """A TCP port free now, for torchrun's rendezvous (test files may run in parallel)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices (probe heads): extra threads only add spin-wait overhead and noise."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cli_models():
    """Each model the neurons/fix/probe commands load, built once per test module and keyed by
    spec (the commands leave no hook behind, so a cached model behaves like a fresh one)."""
    from vitreg.verbs import loading

    built: dict[str, object] = {}
    by_call: dict[str, object] = {}
    real = loading.load_spec

    def cached(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in by_call:
            by_call[key] = real(*args, **kwargs)
        spec = args[0] if args else kwargs["spec"]
        built[spec] = by_call[key]
        return by_call[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loading, "load_spec", cached)
        yield built


def images(b: int = 2, size: int = 56, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, size, size, generator=g)
