"""Option declarations shared by several verbs, so each flag reads and behaves the same everywhere."""

from __future__ import annotations

import typer

from vitreg.verbs.common import DEFAULT_SPEC

SPEC = typer.Argument(None, help=f"Model spec (default: the synthetic demo {DEFAULT_SPEC}).")
IMAGES = typer.Option(
    None,
    "--images",
    help="Folder of images (searched recursively; bad files are skipped), or webdataset "
    "shards as wds:PATTERN (e.g. wds:/data/train-{0000..0099}.tar).",
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
WEIGHTS = typer.Option(
    None,
    "--weights",
    help="Weights file (.safetensors; or a torch state dict, read with weights_only=True) "
    "loaded strictly into SPEC's architecture instead of its pretrained weights; without "
    "--img-size the input size is the file's (a resampled position embedding is announced).",
)
OVERWRITE = typer.Option(
    False,
    "--overwrite",
    help="Replace the run already in --out (its run files are removed first); without it a "
    "folder holding a run is refused.",
)
FIGURE_FORMAT = typer.Option(
    None,
    "--figure-format",
    help="Also write every figure as svg or pdf (next to its 200 dpi PNG).",
)


def out_dir(verb: str) -> typer.models.OptionInfo:
    """The ``--out`` run-directory option of ``verb``."""
    return typer.Option(None, "--out", help=f"Run directory (default runs/<time>_<model>_{verb}).")


CONFIG = typer.Option(
    None,
    "--config",
    help="A run's config.yaml: rerun with its settings (options given here override them).",
)


def resolve_config(
    ctx: typer.Context, cls: type, config: object | None, params: dict[str, object]
) -> object:
    """The verb's typed config from the command's options, or from ``--config`` with the options
    given on the command line on top; raises ``InputError`` naming each wrong field."""
    from vitreg.configs import build_config, read_config

    values = {k: v for k, v in params.items() if k in cls.model_fields}
    if config is None:
        return build_config(cls, values, "bad option", flags=True)
    given = {
        k: v
        for k, v in values.items()
        # by name: typer may vendor its own click, whose enum is not click's
        if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"
    }
    merged = {**read_config(config, cls.verb), **given}
    return build_config(cls, merged, f"--config {config} (or the options given with it)")


CHECKPOINT_EVERY = typer.Option(
    None,
    "--checkpoint-every",
    min=1,
    help="Save the streaming statistics every N images into OUT.resume (beside the run); "
    "running the same command again resumes from there (removed once the run is written).",
)
