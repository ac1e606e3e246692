"""Token-pruning robustness (VisionZip-style pruning; SToP's sink-aware score): keep the top-k
patch tokens by a score and classify the image from what is left.

Per image the last block's attention gives each patch three scores: the [CLS] row (mean of
heads, VisionZip), the attention it receives (column sum over every query, mean of heads) and
SToP's sink-aware [CLS] attention (the images of one batch are its frames); a seeded random
ranking is the control. For each arm and keep ratio r the k = round(r * patches) top patches are
kept and their final features (after the final norm) averaged; a linear probe trained on those
means of the train split is scored (top-1) on the test split's. "all patches" (no pruning) is the
reference. Under a fix every step runs on the fixed model."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from vitreg.errors import InputError
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model
from vitreg.probe import yardsticks
from vitreg.probe.linear import FitResult, FitSettings
from vitreg.probe.metrics import topk_accuracy
from vitreg.probe.pruning_scores import (
    ARMS,
    KEEP_RATIOS,
    RANDOM,
    SINK_GAMMA,
    SINK_MU,
    attention_scores,
    check_ratios,
    keep_count,
    kept_mean,
    random_ranking,
)
from vitreg.probe.tasks.base import TaskResult, probe_scores, register_task
from vitreg.probe.tasks.model_task import ModelTask
from vitreg.results.probe import TaskInfo

SITE = "attn.hook_pattern"
ALL = "all patches"
METRIC = "top1"


def keep_group(ratio: float) -> str:
    """The score group of one keep ratio: ``keep 10%``."""
    return f"keep {ratio:.0%}"


@register_task
class Pruning(ModelTask):
    name = "pruning"
    description = (
        "token pruning: keep the top-k patches by [CLS] attention, received attention, SToP's "
        "sink-aware score or at random, and linear-probe the mean of what is kept; top-1 per "
        "keep ratio"
    )
    target = "label"
    metrics = {METRIC: True}
    trains = True

    def setup(self, model: Model, dataset: Any, options: dict[str, Any]) -> list[str]:
        """Check the model has one [CLS] and a last-block attention pattern; read the options
        (``keep_ratios``, ``sink_mu``, ``sink_gamma``, ``seed``, ``fit``)."""
        if model.layout.n_cls != 1:
            raise InputError(
                f"pruning ranks patches by the [CLS] token's attention and {model.spec} has "
                f"{model.layout.n_cls} [CLS] tokens; use a ViT with one"
            )
        site = hook_name(model.n_layers - 1, SITE)
        if site not in model.hook_names():
            raise InputError(
                f"pruning reads the last block's attention pattern {site!r} and {model.spec} "
                "has none (hierarchical / windowed attention); use a plain ViT"
            )
        self.ratios = check_ratios(tuple(options.get("keep_ratios") or KEEP_RATIOS))
        self.mu = float(options.get("sink_mu", SINK_MU))
        self.gamma = float(options.get("sink_gamma", SINK_GAMMA))
        if not self.gamma > 0:
            raise InputError(f"sink_gamma must be above 0, got {self.gamma}")
        self.seed = int(options.get("seed", 0))
        fit = options.get("fit") or FitSettings()
        if fit.progress is None and options.get("progress") is not None:
            fit = replace(fit, progress=options["progress"])
        self.fit_settings = fit
        self.n_patches = model.layout.n_patches
        self.random = random_ranking(self.n_patches, self.seed)
        self._train: tuple[Tensor, Tensor] | None = None
        return []

    def layer(self, model: Model) -> str:
        return hook_name(model.n_layers - 1, SITE)

    def columns(self) -> list[tuple[str, str]]:
        """(feature, group) of each output column: all patches (group "all"), then each arm at
        each keep ratio."""
        return [(ALL, "all")] + [(a, keep_group(r)) for a in ARMS for r in self.ratios]

    def outputs(self, model: Model, x: Tensor) -> Tensor:
        """``[B, 1 + arms * ratios, D]``: the mean final feature of the patches each arm keeps."""
        name = self.layer(model)

        def scores(pattern: Tensor, hook: HookContext) -> Tensor:
            found = attention_scores(pattern, hook.layout, self.mu, self.gamma)
            return torch.stack([found[a] for a in ARMS if a != RANDOM], 1)

        tokens, cache = model.run_with_cache(x, names=[name], reduce=scores, device=None)
        layout = model.layout.with_extra(0)  # features() strips inserted tokens
        patches = layout.take(tokens, "patches", dim=1).float()
        if patches.shape[1] != self.n_patches:  # an input size other than the model's default
            self.n_patches = patches.shape[1]
            self.random = random_ranking(self.n_patches, self.seed)
        ranked = dict(zip([a for a in ARMS if a != RANDOM], cache[name].unbind(1), strict=True))
        ranked[RANDOM] = self.random.to(patches.device).expand(len(patches), -1)
        out = [patches.mean(1)]
        for arm in ARMS:
            for r in self.ratios:
                out.append(
                    kept_mean(
                        patches, ranked[arm].to(patches.device), keep_count(r, self.n_patches)
                    )
                )
        return torch.stack(out, 1)

    def fit(self, outputs: Tensor, targets: Tensor) -> None:
        """Keep the train split's kept-token means; :meth:`score` trains the probes on them."""
        self._train = (outputs, targets)

    def score(self, outputs: Tensor, targets: Tensor, layer: str) -> TaskResult:
        if self._train is None:
            raise InputError("pruning trains on the train split first: run it through probe.run")
        x_train, y_train = self._train
        y_test = targets.long()
        k = max(int(y_train.max()), int(y_test.max())) + 1
        scores = []
        for j, (feature, group) in enumerate(self.columns()):
            x_test = outputs[:, j]

            def evaluate(
                fit: FitResult, x_test: Tensor = x_test, group: str = group
            ) -> dict[str, float]:
                return {f"{METRIC}/{group}": topk_accuracy(fit.head.logits(x_test), y_test, 1)}

            scores += probe_scores(
                feature, x_train[:, j], y_train.long(), "ce", evaluate, self.metrics,
                self.fit_settings, len(y_test), out_dim=k,
            )  # fmt: skip
        info = TaskInfo(
            num_classes=k,
            keep_ratios=list(self.ratios),
            kept_tokens=[keep_count(r, self.n_patches) for r in self.ratios],
            patches=self.n_patches,
            sink_mu=self.mu,
            sink_gamma=self.gamma,
        )
        notes = [
            f"sink-aware: SToP's score with mu={self.mu:g}, gamma={self.gamma:g}; the images of "
            "one batch are its frames (a position whose [CLS] attention stays high across the "
            "batch is a sink), so it depends on --batch-size"
        ]
        marks = yardsticks.classification(y_train.long(), y_test, k, (METRIC,))
        groups = ["all", *(keep_group(r) for r in self.ratios)]  # each curve point is judged
        marks = [m.model_copy(update={"group": g}) for g in groups for m in marks]
        return TaskResult(self.name, layer, scores, notes, info, marks)
