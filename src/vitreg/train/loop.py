"""``train``: one optimisation loop for every recipe, data-parallel, resumable, logged per step."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitreg.core.io import write_bytes_atomic, write_json_atomic
from vitreg.core.schedule import warmup_cosine
from vitreg.device import check_device
from vitreg.distributed import DistContext, rank_slice, setup
from vitreg.progress import SILENT, Progress, Update
from vitreg.results.train import DinoOptions, ResolvedTrainConfig, SupervisedOptions
from vitreg.settings.train import TrainSettings
from vitreg.train import checkpoint as ckpt_io
from vitreg.train.config import DEFAULTS, amp_dtype, check_batch, check_resume, resolve_steps
from vitreg.train.data import data_identity, derive_seed, num_classes, open_data
from vitreg.train.log import append_record, read_records, trim_after
from vitreg.train.model import build_model, describe
from vitreg.train.recipe import BatchSpec, norm_stats, parse_options


@dataclass
class TrainResult:
    """The trained model (the EMA teacher's backbone for DINO) and the per-step log records.

    On rank 0 ``history`` is the whole log (steps before a resume included); on other ranks it
    holds the steps this call ran.
    """

    model: nn.Module
    out_dir: Path
    config: ResolvedTrainConfig
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int | None = None

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.history]

    @property
    def steps(self) -> int:
        return self.history[-1]["step"] if self.history else 0


def train(
    model_or_spec: nn.Module | str | Mapping[str, Any],
    data: Any,
    settings: TrainSettings | None = None,
    out_dir: str | Path = "runs/train",
    *,
    model_kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    progress: Progress = SILENT,
    label: str = "training (optimizer steps)",
) -> TrainResult:
    """Train a timm ViT on ``data`` with ``settings`` (its recipe, length, batch, schedule,
    checkpoints; the defaults when ``None``); under torchrun every rank takes its slice.

    ``settings.batch_size`` is global (all ranks and accumulation steps); ``lr`` defaults to the
    recipe's base rate x batch_size/256; ``model_kwargs`` go to the model's constructor and
    ``options`` are recipe settings (see ``SupervisedOptions`` and ``DinoOptions``);
    ``progress`` shows the steps as one phase called ``label``, with loss and learning rate,
    opened at the first step (rank 0 only). A resume checks
    that the checkpoint was made with the same settings, data and total steps; ``extend`` lets
    a longer ``steps`` continue a run (its schedule is stretched from there). Writes
    ``log.jsonl``, ``checkpoints/``, ``model.safetensors`` and ``train.json`` to ``out_dir``.
    """
    s = settings if settings is not None else TrainSettings()
    check_device(s.device)
    ctx = setup(s.device)
    devices = [ctx.device.index or 0] if ctx.device.type == "cuda" else []
    run = _Run(model_or_spec, data, s, Path(out_dir), model_kwargs, options, progress, label)
    with torch.random.fork_rng(devices=devices):
        return _run(ctx, run)


@dataclass
class _Run:
    """One call of :func:`train`: what it trains, on what, how, and where."""

    model_or_spec: nn.Module | str | Mapping[str, Any]
    data: Any
    s: TrainSettings
    out: Path
    model_kwargs: Mapping[str, Any] | None
    options: Mapping[str, Any] | None
    progress: Progress
    label: str


def _run(ctx: DistContext, a: _Run) -> TrainResult:
    s, out = a.s, a.out
    recipe_name = s.recipe
    data = open_data(a.data)
    check_batch(s.batch_size, ctx.world, s.accum_steps)
    total = resolve_steps(s.steps, s.epochs, len(data), s.batch_size)
    autocast_dtype = amp_dtype(s.amp, ctx.device)
    base_lr, base_wd, base_clip = DEFAULTS[recipe_name]
    lr = s.lr if s.lr is not None else base_lr * s.batch_size / 256

    torch.manual_seed(s.seed)
    dino = recipe_name == "dino"
    classes = 0 if dino else num_classes(data)
    model = build_model(
        a.model_or_spec,
        dynamic=dino,
        img_size=s.img_size,
        num_classes=classes,
        kwargs=a.model_kwargs,
    )
    img_size = s.img_size or int(model.patch_embed.img_size[0])
    mean, std = norm_stats(model)
    spec = BatchSpec(data, s.seed, s.batch_size, img_size, mean, std)
    recipe, opts = _make_recipe(recipe_name, model, spec, classes, a.options, total)
    recipe.to(ctx.device)

    config = ResolvedTrainConfig(
        recipe=recipe_name,
        steps=total,
        batch_size=s.batch_size,
        lr=lr,
        min_lr=s.min_lr if s.min_lr is not None else lr * 1e-3,
        weight_decay=s.weight_decay if s.weight_decay is not None else base_wd,
        warmup_steps=s.warmup_steps if s.warmup_steps is not None else total // 10,
        clip_grad=s.clip_grad if s.clip_grad is not None else base_clip,
        accum_steps=s.accum_steps,
        amp=s.amp,
        seed=s.seed,
        img_size=img_size,
        checkpoint_every=s.checkpoint_every or min(1000, total),
        keep_checkpoints=s.keep_checkpoints,
        model=describe(a.model_or_spec, a.model_kwargs or {}),
        options=opts,
        data=data_identity(data),
    )
    optimizer = torch.optim.AdamW(param_groups(recipe.module, config.weight_decay), lr=lr)
    scaler = torch.amp.GradScaler("cuda") if autocast_dtype == torch.float16 else None

    start, resumed = _restore(ctx, out, config, recipe, optimizer, scaler, s.resume, s.extend)
    module: nn.Module = recipe.module
    if ctx.world > 1:
        ids = [ctx.device] if ctx.device.type == "cuda" else None
        module = nn.parallel.DistributedDataParallel(recipe.module, device_ids=ids)

    history: list[dict[str, float]] = []
    with ExitStack() as phase:  # opened at the first step: an error before it is shown alone
        update: Update | None = None
        for step in range(start, total):
            record = _step(ctx, step, config, recipe, module, optimizer, scaler, autocast_dtype)
            history.append(record)
            if ctx.is_main:
                append_record(out / "log.jsonl", record)
                if record["step"] % config.checkpoint_every == 0 or record["step"] == total:
                    _save(out, config, recipe, optimizer, scaler, ctx, record["step"])
                if update is None:
                    update = phase.enter_context(a.progress(total, a.label))
                update(record["step"], loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")

    exported = recipe.export()
    if ctx.is_main:  # the whole log: a finished run trained again records its last step
        history = read_records(out / "log.jsonl")
        _export(out, exported, config, history)
    ctx.barrier()
    return TrainResult(exported, out, config, history, resumed)


def _make_recipe(
    name: str, model: nn.Module, spec: BatchSpec, classes: int, options: Any, total: int
) -> tuple[Any, SupervisedOptions | DinoOptions]:
    if name == "dino":
        from vitreg.train.dino import DinoRecipe

        dino = parse_options(DinoOptions, options, name)
        return DinoRecipe(model, spec, dino, total), dino
    from vitreg.train.supervised import SupervisedRecipe

    opts = parse_options(SupervisedOptions, options, name)
    return SupervisedRecipe(model, spec, classes, opts), opts


def param_groups(
    module: nn.Module, weight_decay: float
) -> list[dict[str, list[nn.Parameter] | float]]:
    """AdamW groups ``[decay, no decay]`` by timm's ``param_groups_weight_decay``: no decay on 1-D
    parameters (biases, norms), on the names any submodule's ``no_weight_decay()`` lists, and on
    every ``*token`` and ``*pos_embed``. The attention-bias slots (``k_bias``/``v_bias``, 4-D) are
    decayed like weights, as An et al.'s code does."""
    from timm.optim import param_groups_weight_decay

    skip = [
        f"{prefix}.{n}" if prefix else n
        for prefix, sub in module.named_modules()
        if hasattr(sub, "no_weight_decay")
        for n in sub.no_weight_decay()
    ]
    # weight decay 1.0 only sorts: timm puts everything in one group when it is 0, and drops
    # empty groups; checkpoints index the optimiser state by the two groups in this order
    groups = param_groups_weight_decay(
        module, 1.0, no_weight_decay_list=[*skip, "*token", "*pos_embed"]
    )
    by_decay = {g["weight_decay"] > 0: g["params"] for g in groups}
    return [
        {"params": by_decay.get(True, []), "weight_decay": weight_decay},
        {"params": by_decay.get(False, []), "weight_decay": 0.0},
    ]


def _restore(
    ctx, out, config, recipe, optimizer, scaler, resume: bool, extend: bool
) -> tuple[int, int | None]:
    """Load the newest checkpoint (resume; it must match the run, see ``check_resume``) or
    clear this run's old files (no resume)."""
    folder = out / "checkpoints"
    latest = ckpt_io.latest_checkpoint(folder)
    if not resume or latest is None:
        if ctx.is_main:
            out.mkdir(parents=True, exist_ok=True)
            for old in [*folder.glob("step-*"), out / "log.jsonl"]:
                old.unlink(missing_ok=True)
        ctx.barrier()
        return 0, None
    ckpt = ckpt_io.load_checkpoint(latest)
    check_resume(config, ckpt.meta["config"], ckpt.step, extend)
    ckpt_io.load_into(ckpt, recipe.module, optimizer, recipe)
    if scaler is not None and ckpt.meta.get("scaler"):
        scaler.load_state_dict(ckpt.meta["scaler"])
    if ctx.is_main:
        trim_after(out / "log.jsonl", ckpt.step)
    ctx.barrier()
    return ckpt.step, ckpt.step


def _step(ctx, step, config, recipe, module, optimizer, scaler, autocast_dtype) -> dict[str, float]:
    """One optimizer step over the global batch: this rank's slice in ``accum_steps`` chunks."""
    t0 = time.perf_counter()
    lr = warmup_cosine(step, config.steps, config.lr, config.warmup_steps, config.min_lr)
    for group in optimizer.param_groups:
        group["lr"] = lr
    torch.manual_seed(derive_seed(config.seed, "torch", step, ctx.rank))  # dropout, drop-path
    optimizer.zero_grad(set_to_none=True)
    mine = rank_slice(config.batch_size, ctx.rank, ctx.world)
    k = config.accum_steps
    per = len(mine) // k
    sums: dict[str, torch.Tensor] = {}
    for m in range(k):
        batch = recipe.batch(step, mine[m * per : (m + 1) * per])
        batch = {key: v.to(ctx.device, non_blocking=True) for key, v in batch.items()}
        last = m == k - 1
        sync = module.no_sync() if ctx.world > 1 and not last else nullcontext()
        with sync:
            with torch.autocast(
                ctx.device.type, autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss, parts = recipe.loss(module, batch, step)
            scaled = loss / k
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        for key, v in {"loss": loss, **parts}.items():
            sums[key] = sums.get(key, 0) + v.detach().float() / k
    if config.clip_grad is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(recipe.module.parameters(), config.clip_grad)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    extra = recipe.end_step(step, ctx.reduce_sum)
    keys = list(sums)
    means = ctx.reduce_sum(torch.stack([sums[key] for key in keys])) / ctx.world
    elapsed = time.perf_counter() - t0
    record = {"step": step + 1, "lr": lr, "images_per_s": config.batch_size / elapsed}
    record.update({key: float(v) for key, v in zip(keys, means, strict=True)})
    record.update(extra)
    return record


def _save(out, config, recipe, optimizer, scaler, ctx, step: int) -> None:
    meta = ckpt_io.CheckpointMeta(
        config=config,
        scaler=scaler.state_dict() if scaler is not None else None,
        world_size=ctx.world,
        rng=ckpt_io.RngScheme(seed=config.seed),
    )
    ckpt_io.save_checkpoint(
        out / "checkpoints",
        step,
        recipe.module.state_dict(),
        recipe.extra_state(),
        optimizer,
        meta,
        keep=config.keep_checkpoints,
    )


def _export(
    out: Path, model: nn.Module, config: ResolvedTrainConfig, history: list[dict[str, float]]
) -> None:
    """``model.safetensors`` (the trained backbone) and ``train.json`` (config + last record)."""
    from safetensors.torch import save

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    write_bytes_atomic(out / "model.safetensors", save(state))
    last = history[-1] if history else None
    write_json_atomic(out / "train.json", {"config": config.model_dump(mode="json"), "last": last})
