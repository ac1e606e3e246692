"""Neuron sets on the Hugging Face hub: a hub folder (the set + a model card), fetched by name
with ``--neurons hf:ORG/REPO[@REVISION]`` and uploaded with ``vitreg push DIR ORG/REPO``.

A hub folder holds ``neurons.json`` + ``neurons.safetensors`` (a :class:`NeuronSet` as
``vitreg neurons`` saves it) and ``README.md``, a model card whose YAML metadata says what the
set is for and how it was found: the base model (spec, hub id where there is one, revision and
weight fingerprint), the input resolution(s), the images and their count, the held-out verdict
and stability numbers of the run, the vitreg version and a licence. Downloads go through
``huggingface_hub.snapshot_download``: its cache, ``HF_HUB_OFFLINE=1`` (a filled cache, no
network) and a pinned revision (a branch, tag or commit) all work as for models. The set read
from the hub is checked like a file (``NeuronSet.load``; the weight fingerprint by the verbs).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from vitreg.errors import InputError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.results.base import ResultsModel, Setting, SparseResults
from vitreg.results.neurons import HeldOut, Stability

if TYPE_CHECKING:
    from vitreg.neurons.auto import NeuronSearchResult

PREFIX = "hf:"
SET_NAME = "neurons"  # neurons.json + neurons.safetensors
CARD = "README.md"
FILES = [f"{SET_NAME}.json", f"{SET_NAME}.safetensors", CARD]
DEFAULT_LICENSE = "apache-2.0"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def parse_ref(ref: str) -> tuple[str, str | None]:
    """``(ORG/REPO, REVISION or None)`` of ``hf:ORG/REPO[@REVISION]``."""
    body = ref[len(PREFIX) :] if ref.startswith(PREFIX) else ref
    repo, _, revision = body.partition("@")
    if not _REPO.match(repo) or ".." in repo or (_ and not revision):
        raise InputError(
            f"{ref!r} names no hub neuron set; write hf:ORG/REPO or hf:ORG/REPO@REVISION "
            "(a branch, tag or commit)"
        )
    return repo, revision or None


def hub_model_id(spec: str | None) -> str | None:
    """The hub repository of a model spec where it has one (``timm:NAME`` -> ``timm/NAME``,
    ``hf:ORG/NAME`` -> ``ORG/NAME``), for the card's ``base_model``."""
    if spec is None:
        return None
    source, _, name = spec.partition(":")
    if source == "timm" and name:
        return f"timm/{name}"
    if source == "hf" and _REPO.match(name.partition("@")[0]):
        return name.partition("@")[0]
    return None


class CardInfo(ResultsModel):
    """The card's ``vitreg`` block: what the set is for and how it was found."""

    kind: str
    origin: str
    vitreg_version: str
    base_model_spec: str | None
    base_model_revision: str | None
    model_family: str | None
    weights_fingerprint: str | None
    n_neurons: int
    layers: list[int]
    resolutions: list[list[int]] = Field(description="[[h, w], ...] the set was found at")
    images: str
    n_images: int | None
    held_out: dict[str, Setting] = Field(description="the verdict and the held-out check")
    stability: Stability | None


class CardMetadata(SparseResults):
    """A hub folder's model card metadata (its YAML header); ``base_model`` only where the
    model has a hub repository."""

    license: str
    library_name: str
    tags: list[str]
    vitreg: CardInfo
    base_model: str | None = None


def card_metadata(
    neurons: NeuronSet,
    *,
    resolutions: list[list[int]],
    images: str,
    n_images: int | None,
    held_out: HeldOut | None = None,
    status: str | None = None,
    stability: Stability | None = None,
    base_revision: str | None = None,
    license: str = DEFAULT_LICENSE,
    origin: str | None = None,
) -> CardMetadata:
    """The card's YAML metadata for ``neurons`` found on ``n_images`` images (``images`` says
    which) at ``resolutions`` (``[[h, w], ...]``), with the run's held-out check and stability;
    ``origin`` names where a set not found by a vitreg run comes from."""
    from vitreg.core.version import __version__

    base = hub_model_id(neurons.model_spec)
    info = CardInfo(
        kind="neuron_set",
        origin=origin or "found by `vitreg neurons`",
        vitreg_version=__version__,
        base_model_spec=neurons.model_spec,
        base_model_revision=base_revision,
        model_family=neurons.model_family,
        weights_fingerprint=neurons.fingerprint,
        n_neurons=len(neurons),
        layers=sorted(set(neurons.layers)),
        resolutions=[list(map(int, r)) for r in resolutions],
        images=images,
        n_images=None if n_images is None else int(n_images),
        held_out={"status": status, **(held_out.model_dump() if held_out else {})},
        stability=stability,
    )
    return CardMetadata(
        license=license,
        library_name="vitreg",
        tags=["vitreg", "register-neurons", "test-time-registers"],
        vitreg=info,
        **({"base_model": base} if base is not None else {}),
    )


def _card_text(metadata: CardMetadata) -> str:
    from huggingface_hub import ModelCardData

    meta = metadata.model_dump(mode="json")
    v = meta["vitreg"]
    held = v["held_out"]
    verdict = held.get("status") or "not checked"
    before, after = held.get("outlier_rate_before"), held.get("outlier_rate_after")
    rates = (
        f" (patch outlier rate {before:.2%} before, {after:.2%} after the fix, on "
        f"{held.get('n_images')} held-out images)"
        if before is not None and after is not None
        else ""
    )
    stab = v["stability"]
    overlap = (
        f"; the sets chosen on each half of the images overlap by "
        f"{stab['overlap_between_halves']:.0%}"
        if stab
        else ""
    )
    extra = {k: meta[k] for k in meta if k not in ("license", "library_name", "tags")}
    data = ModelCardData(license=meta["license"], library_name="vitreg", tags=meta["tags"], **extra)
    body = (
        f"# Register neurons of {v['base_model_spec']}\n\n"
        f"{v['n_neurons']} MLP units in blocks {v['layers']} that write the high-norm outlier "
        f"tokens ({v['origin']}; written by vitreg {v['vitreg_version']}), found on "
        f"{v['n_images'] or 'an unstated number of'} images ({v['images']}) at "
        f"{' and '.join('x'.join(map(str, r)) for r in v['resolutions'])} px.\n\n"
        f"Held-out check: {verdict}{rates}{overlap}.\n\n"
        "Use them without training (test-time registers):\n\n"
        "```bash\n"
        f"vitreg fix {v['base_model_spec']} --neurons hf:ORG/REPO --images DIR\n"
        "```\n\n"
        "The set's weight fingerprint is checked against the loaded model; a different "
        "checkpoint of the same architecture is warned about.\n"
    )
    return f"---\n{data.to_yaml()}\n---\n{body}"


def write_folder(neurons: NeuronSet, directory: str | Path, meta: CardMetadata) -> Path:
    """Write a hub-ready folder: the set (``neurons.json`` + ``.safetensors``) and the model
    card ``README.md`` with ``meta`` (see :func:`card_metadata`); returns the folder."""
    from vitreg.core.disk import writing
    from vitreg.core.io import write_text_atomic

    folder = Path(directory).expanduser()
    if folder.exists() and not folder.is_dir():
        raise InputError(f"hub folder {str(folder)!r} exists and is not a folder")
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    neurons.save(folder / SET_NAME)
    write_text_atomic(folder / CARD, _card_text(meta))
    return folder


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """The YAML metadata of a hub folder's model card (``{}`` without a card)."""
    from huggingface_hub import ModelCard

    card = Path(directory) / CARD
    if not card.is_file():
        return {}
    try:
        return ModelCard.load(card).data.to_dict()
    except (ValueError, TypeError) as e:  # YAML that is not a mapping, or broken
        raise InputError(f"the model card {str(card)!r} has unreadable metadata ({e})") from None


def read_folder(directory: str | Path) -> NeuronSet:
    """The neuron set of a hub folder, checked like any NeuronSet file, and against its card
    (the same base model spec and neuron count, when the card states them)."""
    folder = Path(directory)
    neurons = NeuronSet.load(folder / SET_NAME)
    v = read_metadata(folder).get("vitreg") or {}
    if not isinstance(v, dict):
        raise InputError(f"{str(folder / CARD)!r}: the 'vitreg' metadata must be a mapping")
    for key, have in (("base_model_spec", neurons.model_spec), ("n_neurons", len(neurons))):
        if key in v and v[key] != have:
            raise InputError(
                f"hub folder {str(folder)!r}: the card says {key} {v[key]!r} but the set has "
                f"{have!r}; the folder was edited or mixes two sets (write it again)"
            )
    return neurons


def download(ref: str) -> tuple[Path, str | None]:
    """The local snapshot folder of ``hf:ORG/REPO[@REVISION]`` (from the cache when it is
    there; with ``HF_HUB_OFFLINE=1`` only from the cache) and the commit it resolved to."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo, revision = parse_ref(ref)
    try:
        path = Path(snapshot_download(repo, revision=revision, allow_patterns=FILES))
    except LocalEntryNotFoundError:
        raise InputError(
            f"{ref}: not in the local hub cache and the hub cannot be reached (offline, "
            "HF_HUB_OFFLINE=1, or no connection); fetch it once online, or pass a neuron set "
            "file"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise InputError(f"{ref}: the hub refused the download ({e})") from None
    commit = path.name if re.fullmatch(r"[0-9a-f]{40}", path.name) else None
    return path, commit


def load_hub(ref: str) -> NeuronSet:
    """The neuron set ``hf:ORG/REPO[@REVISION]`` names; its ``data["hub"]`` says the repository,
    the revision asked for and the commit read."""
    path, commit = download(ref)
    neurons = read_folder(path)
    repo, revision = parse_ref(ref)
    neurons.data = {**neurons.data, "hub": {"repo": repo, "revision": revision, "commit": commit}}
    return neurons


def push(
    directory: str | Path,
    repo: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    api: Any = None,
) -> str:
    """Upload a hub folder to ``ORG/REPO`` (created if missing) with ``huggingface_hub``; the
    token comes from the usual places (``HF_TOKEN``, ``huggingface-cli login``). Checks the
    folder first (it must read back as a set). Returns the commit URL."""
    from huggingface_hub import HfApi

    repo_id, pinned = parse_ref(repo)
    if pinned is not None:
        raise InputError(f"push to {repo_id}; pass a branch with --revision, not @{pinned}")
    folder = Path(directory).expanduser()
    if not folder.is_dir():
        raise InputError(f"{str(folder)!r} is not a hub folder (write one with --hub-dir)")
    neurons = read_folder(folder)
    if not (folder / CARD).is_file():
        raise InputError(f"{str(folder)!r} has no model card {CARD} (write it with --hub-dir)")
    from huggingface_hub.errors import HfHubHTTPError

    from vitreg.core.disk import failing_disk, write_error

    api = api if api is not None else HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            allow_patterns=FILES,
            revision=revision,
            commit_message=f"vitreg neuron set ({len(neurons)} neurons)",
        )
    except (HfHubHTTPError, OSError) as e:
        if isinstance(e, OSError) and failing_disk(e):  # the hub client's own cache files
            raise write_error(e, e.filename or folder) from None
        raise InputError(
            f"uploading {str(folder)!r} to {repo_id} failed ({e}); log in with "
            "`hf auth login` or set HF_TOKEN to a token that may write to the repository"
        ) from None
    return str(getattr(info, "commit_url", info))


def run_metadata(
    found: NeuronSearchResult,
    model: Any,
    images: str,
    n_images: int,
    license: str = DEFAULT_LICENSE,
) -> CardMetadata:
    """The card metadata of a set ``vitreg neurons`` found (a
    :class:`~vitreg.neurons.auto.NeuronSearchResult`) on ``model`` with ``n_images`` images
    (``images`` says which): its resolution, the held-out check and stability."""
    h, w = model.adapter.default_image_size()
    return card_metadata(
        found.chosen,
        resolutions=[[int(h), int(w)]],
        images=images,
        n_images=n_images,
        held_out=found.held_out,
        status=found.status,
        stability=found.stability,
        license=license,
    )
