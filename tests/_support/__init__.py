"""Helpers the tests share and the worker scripts they start (torchrun, subprocesses)."""
