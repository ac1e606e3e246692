"""``vitreg fix --method a,b,...`` (any method but plain ``ttr``): every listed fix on one model
and one image set, measured side by side into one leaderboard (table, JSON, figure)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitreg.configs import FixConfig
from vitreg.core.renamed import renamed
from vitreg.core.run_dir import session
from vitreg.progress import SILENT, Progress
from vitreg.results.leaderboard import BoardEntry, BoardResults
from vitreg.results.probe import ProbeScore
from vitreg.results.schema import plain
from vitreg.verbs.common import images_named, prepare
from vitreg.verbs.loading import check_images, model_and_images
from vitreg.verbs.neuron_sources import load_neurons
from vitreg.verbs.result import BoardRun, Listener, Notices

if TYPE_CHECKING:
    from vitreg.fix.leaderboard import Scorer

CACHE = Path(".vitreg-cache") / "features"  # the probe verb's default feature cache


def probe_scorer(spec: str, cache: Path, batch_size: int, protocol: str = "shared") -> Scorer:
    """A leaderboard scorer running probe ``TASK:DATA`` on the model, bare or under a fix
    (ov-seg under ``protocol``)."""
    from vitreg.probe.run import run

    task, _, data = spec.partition(":")
    options = {"protocol": protocol} if protocol != "shared" else None

    def score(model: Any, fix: Any) -> dict[str, ProbeScore]:
        # ov-seg takes each benchmark's short side (336, 448, 560) from the protocol itself
        result = run(model, task, data, fix=fix, base=fix is None, cache_dir=cache,
                     batch_size=batch_size, task_options=options)  # fmt: skip
        layer = result.results.conditions["fixed" if fix is not None else "base"][-1]
        # a board scores against the other fixes, not the yardsticks
        return {
            f"{task} {s.metric}": ProbeScore.model_validate(s.model_dump(exclude={"vs_yardsticks"}))
            for s in layer.scores
        }

    return score


def with_protocol(board: BoardResults, protocol: str, probe: str, model: Any) -> BoardResults:
    """``board`` with each scored row's ov-seg settings and their source (the unfixed model,
    compositions and methods without published settings: the shared ones, said so)."""
    from vitreg.data.datasets import open_dataset
    from vitreg.probe.tasks.ov_seg import protocol_record

    _, _, data = probe.partition(":")
    dataset = open_dataset(data, "val").name
    rows = [
        r
        if r.refused
        else r.model_copy(
            update={"protocol": protocol_record(protocol, _method(r), dataset, model)}
        )
        for r in board.rows
    ]
    return board.model_copy(update={"rows": rows, "protocol": protocol})


def _method(row: BoardEntry) -> str | None:
    """The fix method a row ran, as its fix describes itself; None for the unfixed model."""
    from vitreg.probe.tasks.ov_seg import fix_method

    return None if row.fix is None else fix_method(row.fix)


@session()  # the --out claimed inside is released when the verb ends
def run_leaderboard(
    cfg: FixConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> BoardRun:
    """Measure every entry of ``cfg.method`` against the unfixed model; write the leaderboard."""
    from vitreg.fix.leaderboard import bench_fixes, expand
    from vitreg.fix.methods import FIXES, FixInputs, parse_entries
    from vitreg.report.renderers.leaderboard import write_leaderboard
    from vitreg.results.leaderboard import BoardDocument
    from vitreg.results.schema import DataInfo, is_synthetic, model_info, utc_now, versions

    notices = Notices(on_notice)
    cfg, command = prepare(cfg, notices, demo=f"planted register neurons, on {images_named(cfg)}")
    entries = parse_entries(cfg.method)
    check_images(cfg.images)
    model, source = model_and_images(cfg, cfg.device, progress, notices)
    neurons = None
    if any(m.needs_neurons for e in entries for m in FIXES.parts(e)):
        neurons, _, _ = load_neurons(model, cfg.spec, cfg.neurons, source, cfg, progress, notices)
    ttr = {"n_registers": cfg.registers, "cls": cfg.cls, "patches": cfg.patches, "mode": cfg.mode}
    inputs = FixInputs(model, neurons, source, cfg.batch_size, ttr)
    rows = expand(entries)
    with progress(len(rows), "fixes measured against the unfixed model") as update:
        done: list[str] = []

        def step(entry: str) -> None:
            done.append(entry)
            update(len(done) - 1)

        scorers = {}
        if cfg.probe is not None:
            scorers[cfg.probe] = probe_scorer(cfg.probe, CACHE, cfg.batch_size, cfg.protocol)
        board = bench_fixes(
            model,
            entries,
            source,
            inputs,
            batch_size=cfg.batch_size,
            scorers=scorers,
            progress=step,
        )
        update(len(rows))
    if cfg.protocol != "shared" and cfg.probe is not None:
        board = with_protocol(board, cfg.protocol, cfg.probe, model)
    described = model.describe()
    doc = BoardDocument(
        **versions(),
        created=utc_now(),
        model=cfg.spec,
        synthetic=is_synthetic(described),
        data=DataInfo.model_validate(plain(source.description())),
        command=command,
        config=cfg.to_file(),
        model_info=model_info(described),
        board=board,
    )
    written = write_leaderboard(Path(cfg.out), doc)
    return BoardRun(Path(cfg.out), board, notices.items, written)


__getattr__ = renamed(__name__, {"run_fix_board": "run_leaderboard"}, globals())
