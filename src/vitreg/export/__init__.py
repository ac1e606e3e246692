"""Activations for other tools: ``vitreg export`` writes a model's activations at chosen sites,
every token labelled (kind, grid cell, norms, diagnose's outlier and sink flags), as
safetensors shards with a JSON index, parquet tables and zarr patch grids; :func:`open` reads
them back as a torch ``Dataset``."""

from vitreg.export.reader import Exported, ShardStream, Token, open
from vitreg.export.run import Plan
from vitreg.export.writer import Written, export

__all__ = ["Exported", "Plan", "ShardStream", "Token", "Written", "export", "open"]
