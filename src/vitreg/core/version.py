"""The vitreg version, where every layer can read it (``vitreg.__version__`` re-exports it)."""

__version__ = "0.1.0"
