"""Loaders, one module per spec source, named in :data:`vitreg.models.load.LOADERS` and imported
on first use."""
