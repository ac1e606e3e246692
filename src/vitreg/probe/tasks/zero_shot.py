"""CLIP zero-shot classification (Jiang et al. Table 3): the dataset's class names in OpenAI's 80
ImageNet prompt templates (or the user's), class embeddings from the text tower, logits =
``logit_scale`` × cosine of image and class embeddings; top-1 / top-5 on the test split. Nothing
is trained; the fix reaches the scores only through the image embedding."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from vitreg.errors import InputError
from vitreg.models.model import Model
from vitreg.probe.metrics import topk_accuracy
from vitreg.probe.tasks.base import TaskResult, register_task, score_over_seeds
from vitreg.probe.tasks.model_task import ModelTask
from vitreg.probe.yardsticks import yardstick
from vitreg.probe.zero_shot.class_cache import cached_class_embeddings
from vitreg.probe.zero_shot.prompts import class_names, openai_templates, read_templates
from vitreg.probe.zero_shot.text import ClipTowers, clip_towers, zero_shot_logits
from vitreg.progress import SILENT
from vitreg.results.probe import TaskInfo

FEATURE = "clip image embedding"


@register_task
class ZeroShot(ModelTask):
    name = "zero-shot"
    description = (
        "CLIP zero-shot classification: class-name prompts (80 OpenAI templates or --templates) "
        "through the text tower, cosine × logit scale; top-1 / top-5, no training"
    )
    target = "label"
    metrics = {"top1": True, "top5": True}

    towers: ClipTowers
    classes: Tensor
    info: TaskInfo

    def setup(self, model: Model, dataset: Any, options: dict[str, Any]) -> list[str]:
        """Class embeddings of the dataset's class names (the text tower is not under the fix)."""
        self.towers = clip_towers(model)
        spec = dataset.describe().get("spec", dataset.name)
        names, notes = class_names(dataset.class_names, spec)
        path = options.get("templates")
        templates = read_templates(path) if path is not None else openai_templates()
        root = options.get("cache_dir")
        self.classes, path, reused = cached_class_embeddings(
            self.towers, names, templates, root, options.get("progress", SILENT)
        )
        if reused:
            notes.append(f"class embeddings read from {path} (no text-tower pass)")
        self.info = TaskInfo(
            num_classes=len(names),
            templates=len(templates),
            templates_source=str(path) if path is not None else "openai-imagenet-80",
            logit_scale=self.towers.logit_scale,
            clip=self.towers.name,
            class_embeddings=str(path) if path is not None else None,
        )
        return notes

    def layer(self, model: Model) -> str:
        return "image embedding"

    def outputs(self, model: Model, x: Tensor) -> Tensor:
        return self.towers.images(x)

    def score(self, outputs: Tensor, targets: Tensor, layer: str) -> TaskResult:
        k = len(self.classes)
        if int(targets.max()) >= k:
            raise InputError(
                f"a test label ({int(targets.max())}) has no class name: the dataset names {k} "
                "classes; its labels must index its class names"
            )
        logits = zero_shot_logits(outputs, self.classes, self.towers.logit_scale)
        n = len(targets)
        scores = [
            score_over_seeds(FEATURE, "top1", [topk_accuracy(logits, targets, 1)], True, n_test=n)
        ]
        notes = []
        if k > 5:  # with 5 classes or fewer top-5 is 1 by construction
            scores.append(
                score_over_seeds(
                    FEATURE, "top5", [topk_accuracy(logits, targets, 5)], True, n_test=n
                )
            )
        else:
            notes.append(f"top-5 not reported: {k} classes make it 1 by construction")
        guess = f"uniform guess over {k} classes"
        top = {"top1": 1, "top5": 5}
        marks = [yardstick("chance", s.metric, min(top[s.metric] / k, 1.0), guess) for s in scores]
        return TaskResult(self.name, layer, scores, notes, self.info.model_copy(), marks)
