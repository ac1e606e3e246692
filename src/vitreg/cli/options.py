"""Option declarations shared by several verbs, so each flag reads and behaves the same everywhere."""

from __future__ import annotations

import typer

DEFAULT_SPEC = "planted:dinov2_s14"

SPEC = typer.Argument(None, help=f"Model spec (default: the synthetic demo {DEFAULT_SPEC}).")
IMAGES = typer.Option(
    None, "--images", help="Folder of images (searched recursively; bad files are skipped)."
)
SAMPLES = typer.Option(False, "--samples", help="Use the photos bundled with scikit-image.")
LIMIT = typer.Option(None, "--limit", min=1, help="Use at most N images.")
BATCH_SIZE = typer.Option(32, "--batch-size", min=1, help="Images per forward pass.")
IMG_SIZE = typer.Option(
    None, "--img-size", min=1, help="Input size in pixels (passed as img_size where taken)."
)
RANDOM_INIT = typer.Option(
    False, "--random-init", help="Build the architecture with random weights (no download)."
)
DEVICE = typer.Option(None, "--device", help="torch device, e.g. cpu or cuda:0.")


def out_dir(verb: str) -> typer.models.OptionInfo:
    """The ``--out`` run-directory option of ``verb``."""
    return typer.Option(None, "--out", help=f"Run directory (default runs/<time>_<model>_{verb}).")
