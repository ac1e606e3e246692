"""Data: image folders, dataset formats, sample photos, synthetic datasets."""
