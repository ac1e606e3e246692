"""Command-line interface: a typer app (``vitreg``) with one module per verb."""
