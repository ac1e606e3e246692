"""The ``results`` block of each verb's metrics.json as nested pydantic models (schema 2.0):
one module per verb mirroring its analysis dataclasses, so renderers read attributes whose
types say which may be None."""
