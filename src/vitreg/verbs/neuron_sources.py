"""Where a verb's register neurons come from (a :class:`~vitreg.configs.NeuronSource`): a
NeuronSet file, the built-in set, a set on the Hugging Face hub, or discovery on the run's own images (the automatic path of
``vitreg neurons``). A new kind of source adds its reader to :data:`READERS`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vitreg.progress import Progress
from vitreg.results.fix import NeuronsUsed
from vitreg.results.neurons import PlantedRow
from vitreg.settings.neurons import NeuronSearch, NeuronSource
from vitreg.verbs.result import Notice, Notices

if TYPE_CHECKING:
    from vitreg.fix.neuron_set import NeuronSet
    from vitreg.neurons.auto import NeuronSearchResult

DISCOVERED = (
    "discovered on these images by this run (3 of every 4; the causal check and top-k on the 4th)"
)


def _builtin(source: NeuronSource, spec: str) -> Any:
    from vitreg.neurons import builtin_neurons

    return builtin_neurons(spec)


def _file(source: NeuronSource, spec: str) -> Any:
    from vitreg.fix.neuron_set import NeuronSet

    return NeuronSet.load(source)


def _hub(source: NeuronSource, spec: str) -> Any:
    from vitreg.neurons import hub

    return hub.load_hub(source)


READERS: dict[str, Callable[[NeuronSource, str], Any]] = {
    "builtin": _builtin,
    "file": _file,
    "hub": _hub,
}
"""How each kind of source but discovery is read: ``reader(source, spec) -> NeuronSet``."""


def neuron_file(neurons: NeuronSource | str | None, spec: str) -> Any:
    """The NeuronSet that ``neurons`` names, read and validated (a spec without a built-in set
    is refused), before any model loads; ``None`` for discovery."""
    neurons = NeuronSource.parse(neurons)  # a library caller may spell it as a plain string
    if neurons.kind == "discover":
        return None
    return READERS[neurons.kind](neurons, spec)


def search_neurons(
    model: Any,
    source: Any,
    search: NeuronSearch,
    progress: Progress,
    notices: Notices,
    *,
    batch_size: int,
    stability: bool = False,
    check_sizes: list[int] | None = None,
) -> NeuronSearchResult:
    """The library's automatic path on ``source`` with the settings of ``search`` (passed whole)
    and ``vitreg neurons``' own checks (``stability``, ``check_sizes``); the split as
    metrics.json records it (images used, after skips and the held-out cap) goes to
    ``notices``."""
    from vitreg.neurons.auto import SPLIT_RULE, find_neurons

    sizes = list(check_sizes or ())
    if sizes:
        accept_sizes(model, sizes, notices)
    found = find_neurons(
        model,
        source,
        search,
        n_images=source.total,
        batch_size=batch_size,
        stability=stability,
        check_sizes=sizes,
        progress=progress,
    )
    split = found.split
    notices.append(
        Notice(
            "split",
            f"split: {split['n_discovery']} images for discovery, {split['n_held_out']} held out "
            f"({SPLIT_RULE})",
        )
    )
    return found


def accept_sizes(model: Any, sizes: list[int], notices: Notices) -> None:
    """Let a timm ViT built for one size take the other ``sizes`` too (position-embedding
    interpolation, outputs at the built size unchanged), said in a notice; other models keep
    their own rule, and a size they refuse is refused by the automatic path with the reason."""
    from vitreg.errors import InputError
    from vitreg.models.input_size import enable_dynamic_size

    try:
        for size in sizes:
            model.layout_for((size, size))
    except InputError:
        module = model.module
        if not (hasattr(module, "patch_embed") and hasattr(module, "dynamic_img_size")):
            return
        enable_dynamic_size(module)
        notices.append(
            Notice(
                "sizes",
                f"--check-sizes {','.join(map(str, sizes))}: the model now takes other sizes "
                "(position embeddings interpolated, as timm's dynamic_img_size does)",
            )
        )


def load_neurons(
    model: Any,
    spec: str,
    neurons: NeuronSource | str | None,
    source: Any,
    cfg: Any,
    progress: Progress,
    notices: Notices,
    preloaded: Any = None,
) -> tuple[NeuronSet, NeuronsUsed, NeuronSearchResult | None]:
    """The NeuronSet ``neurons`` names (``preloaded`` if read already), or the one discovered
    first with ``cfg``'s search and batch size (a verb config: a NeuronSearch and an ImageSet);
    what it is; and the discovery."""
    neurons = NeuronSource.parse(neurons)
    from vitreg.fix.neuron_set import weights_fingerprint
    from vitreg.neurons.auto import layer_counts

    found = None
    if neurons.kind == "discover":
        notices.append(
            Notice(
                "discovery",
                "--neurons discover: discovering register neurons on these images first (as "
                "`vitreg neurons` does); the fix is then evaluated on the same images.",
                caution=True,
            )
        )
        found = search_neurons(model, source, cfg, progress, notices, batch_size=cfg.batch_size)
        chosen = found.chosen
        origin = DISCOVERED
    else:
        read = READERS[neurons.kind]
        chosen = preloaded if preloaded is not None else read(neurons, model.spec or spec)
        origin = _origin(neurons, chosen)
    chosen.check_applicable(model)  # other architecture, bad units or settings, empty: clear error
    matches = None
    if chosen.fingerprint is not None:
        matches = chosen.fingerprint == weights_fingerprint(model.module)
        if not matches:
            notices.append(
                Notice(
                    "warning",
                    f"this NeuronSet was made for {chosen.model_spec} with other weights than "
                    f"{model.spec} (same shape, different weight fingerprint); the neurons may "
                    "not be this model's register neurons.",
                    caution=True,
                )
            )
    info = NeuronsUsed.model_validate(
        {
            "source": origin,
            "model_spec": chosen.model_spec,
            "n_neurons": len(chosen),
            "layers": layer_counts(chosen),
            "fingerprint": chosen.fingerprint,
            "fingerprint_matches": matches,
            "settings": chosen.settings,
        }
    )
    return chosen, info, found


def _origin(neurons: NeuronSource, chosen: Any) -> str:
    """What a set read from ``neurons`` is, as metrics.json records it (a hub set with the
    commit read)."""
    if neurons.kind == "builtin":
        return f"the built-in set for {chosen.model_spec}"
    if neurons.kind == "hub":
        commit = chosen.data.get("hub", {}).get("commit")
        return f"the hub set {neurons}" + (f" (commit {commit})" if commit else "")
    return f"the {neurons.kind} {neurons}"


def planted_rows(model: Any, pairs: list[tuple[int, int]]) -> list[PlantedRow] | None:
    """A planted fixture's units with their role and whether ``pairs`` includes them."""
    truth = getattr(model.module, "vitreg_planted", None)
    if truth is None:
        return None
    roles = [(*u, "cause (writes the outliers)") for u in truth.causal_units]
    roles += [(*u, "reader (fires on outliers)") for u in truth.reader_units]
    roles += [(lay, u, f"distractor ({kind})") for lay, u, kind in truth.distractor_units]
    roles += [
        (lay, u, f"helper ({kind}; upstream circuit that flags flat patches)")
        for lay, u, kind in truth.helper_units
    ]
    chosen = set(pairs)
    return [
        PlantedRow(layer=lay, unit=u, role=role, chosen=(lay, u) in chosen)
        for lay, u, role in roles
    ]
