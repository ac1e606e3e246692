"""The bottom layer every other package builds on: token layouts, atomic writes, the version."""
