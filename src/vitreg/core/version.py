"""The vitreg version, read from the installed package's metadata (``pyproject.toml`` holds it)
where every layer can read it; ``vitreg.__version__`` re-exports it."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vitreg")
except PackageNotFoundError:  # a source tree on the path, never installed
    __version__ = "0+unknown"
