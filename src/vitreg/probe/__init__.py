"""Probes: cached token features and the tasks trained on them."""

from vitreg.probe.cache import CachedFeatures, extract

__all__ = ["CachedFeatures", "extract"]
