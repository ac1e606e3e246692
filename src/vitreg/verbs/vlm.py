"""The vlm verb: a LLaVA model's answers and language->image attention without and with
test-time registers on its vision tower, written as ``vitreg vlm`` does."""

from __future__ import annotations

from typing import Any, TypedDict

from vitreg.configs import VlmConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.results.fix import NeuronsUsed
from vitreg.results.schema import model_info, plain
from vitreg.results.vlm import VlmResults
from vitreg.verbs.common import prepare
from vitreg.verbs.loading import model_and_images
from vitreg.verbs.neuron_sources import load_neurons, neuron_file
from vitreg.verbs.result import Listener, Notice, Notices, VlmRun

#: the VLM around the tower, as the model block's ``vlm`` entry holds it
VlmTower = TypedDict(
    "VlmTower",
    {
        "class": str,
        "language_model_layers": int,
        "language_model_attention": str,
        "vision_feature_layer": int,
        "vision_feature_select_strategy": str,
        "n_params": int,
    },
)


def describe_vlm(model: Any) -> VlmTower:
    """The VLM around the tower: class, language-model depth, feature layer and strategy."""
    vlm = model.vlm
    return {
        "class": type(vlm.module).__name__,
        "language_model_layers": len(vlm.lm_layers),
        "language_model_attention": vlm.lm_attention,
        "vision_feature_layer": vlm.feature_layer,
        "vision_feature_select_strategy": vlm.strategy,
        "n_params": sum(p.numel() for p in vlm.module.parameters()),
    }


@session()  # the --out claimed inside is released when the verb ends
def run_vlm(
    cfg: VlmConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> VlmRun:
    """Answer ``cfg``'s prompt per image without and with the fix and write the run directory."""
    from vitreg.distributed import is_main
    from vitreg.fix import TestTimeRegisters
    from vitreg.report.render.plots import display_images
    from vitreg.report.renderers.vlm import write_vlm_run
    from vitreg.report.writer import as_json
    from vitreg.vlm import run_vlm as answer
    from vitreg.vlm.run import SUPPRESSED

    notices = Notices(on_notice)
    cfg, command = prepare(cfg, notices)
    spec, run_dir = cfg.spec, cfg.out
    preloaded = neuron_file(cfg.neurons, spec)  # a missing or bad file fails before the model
    model, source = model_and_images(cfg, cfg.device, progress, notices, cfg.limit or 64)
    chosen, info, _ = load_neurons(
        model, spec, cfg.neurons, source, cfg, progress, notices, preloaded
    )
    ttr = TestTimeRegisters.from_settings(chosen, cfg)
    notices.append(Notice("generation", f"answers: greedy; {SUPPRESSED}."))
    with progress(source.total, "answering without, then with the fix (images)") as update:
        result = answer(
            model,
            source,
            cfg.prompt,
            ttr,
            max_new_tokens=cfg.max_new_tokens,
            query=cfg.query,
            batch_size=cfg.batch_size,
            progress=update,
            llm_layers=cfg.llm_layers,
            taxonomy_k=cfg.taxonomy_k,
            sink_tokens=cfg.sink_tokens,
            dead_tokens=cfg.dead_tokens,
        )
    neurons = NeuronsUsed.model_validate(plain(info))
    results = result.results.model_copy(update={"neurons": neurons})
    first = result.images[0]
    layer_maps = {
        "before": first.before.layer_grids.numpy(),
        "after": first.after.layer_grids.numpy(),
    }
    document = None
    if is_main():
        with progress(None, "writing the report"):
            document = write_vlm_run(
                run_dir,
                results,
                model_info(model.describe(), vlm=describe_vlm(model)),
                source.description(),
                cfg,
                command,
                images=display_images(source.display_images()),
                layer_maps=layer_maps,
            )
    written = None if document is None else as_json(document)
    return VlmRun("vlm", run_dir, written, notices.items, results=results)


VERB = register(
    Verb(
        config=VlmConfig,
        run=run_vlm,
        help="""Answer a prompt per image without and with test-time registers on the VLM's vision
    tower; report the language model's attention over the image, the tower's norms, the
    answers and the sink / dead / alive split of the image tokens.""",
        results=VlmResults,
        renderer="vitreg.report.renderers.vlm",
        argument=("spec",),
    )
)
