"""The words and bounds users choose from, defined once and without torch, so that the typed
configs (and the CLI's ``--help`` generated from them) load in a fraction of a second."""

from __future__ import annotations

RULES: tuple[str, ...] = ("auto", "absolute", "top_p", "robust_z", "mean3std", "robust")
"""Every outlier rule name vitreg knows; the subsets below are taken from it."""

SET_RULES: tuple[str, ...] = ("absolute", "top_p", "robust_z", "auto")
"""Rules giving one cut for a pooled set of norms (the norm analysis)."""

MASK_RULES: tuple[str, ...] = ("auto", "absolute", "mean3std", "robust")
"""Rules giving a ``[B, N]`` mask batch by batch (register neurons)."""

NAMED_THRESHOLDS: tuple[str, ...] = tuple(r for r in MASK_RULES if r != "absolute")
"""``--threshold`` words of ``vitreg neurons`` (``absolute`` is given as a number there)."""

PER_IMAGE_RULES: tuple[str, ...] = ("mean3std", "robust")
"""Mask rules whose cut is computed per image (no value)."""

MAX_IMG_SIZE = 4096
"""Pixels per side of the largest input vitreg builds a model for."""

RECIPES: tuple[str, ...] = ("supervised", "dino")
"""Training recipes: DeiT III supervised, DINO/iBOT self-supervised."""

AMP: tuple[str, ...] = ("auto", "off", "bf16", "fp16")
"""Autocast modes of training ("auto": bf16 or fp16 on CUDA, off on CPU)."""

MAX_SEED = 2**32 - 1
"""The largest seed: every RNG vitreg seeds (torch, numpy, the data order) takes it."""
