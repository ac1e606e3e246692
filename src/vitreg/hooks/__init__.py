"""Hook sites, activation cache and streaming reducers."""

from vitreg.hooks.cache import ActivationCache
from vitreg.hooks.names import BLOCK_SITES, hook_name
from vitreg.hooks.reducers import Histogram, Max, Mean, Reducer, TokenNorms, TopK
from vitreg.hooks.sites import Handle, HookContext

__all__ = [
    "BLOCK_SITES",
    "ActivationCache",
    "Handle",
    "Histogram",
    "HookContext",
    "Max",
    "Mean",
    "Reducer",
    "TokenNorms",
    "TopK",
    "hook_name",
]
