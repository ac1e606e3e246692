"""The push verb: upload a hub folder (``vitreg neurons --hub-dir DIR``) to the Hugging Face
hub; the token comes from HF_TOKEN or `hf auth login`."""

from __future__ import annotations

from vitreg.configs import PushConfig
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.verbs.result import Listener, PushRun


def run_push(
    cfg: PushConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> PushRun:
    """Upload ``cfg.directory`` to ``cfg.repo`` (created if missing); the commit's URL."""
    from vitreg.neurons.hub import push

    url = push(cfg.directory, cfg.repo, private=cfg.private or None, revision=cfg.revision)
    return PushRun(cfg.directory, cfg.repo, url)


VERB = register(
    Verb(
        config=PushConfig,
        run=run_push,
        help="Upload a neuron set's hub folder; the token comes from HF_TOKEN or `hf auth login`.",
        argument=("directory", "repo"),
    )
)
