"""Compact DINO + iBOT: EMA teacher, [CLS] distillation over multi-crop, masked-patch loss.

The student sees 2 global crops (with random patches replaced by a learnable mask token) and
``n_local_crops`` smaller crops; the teacher (an EMA of the student) sees the unmasked global
crops. Both go through one shared DINO head (MLP -> L2 norm -> weight-normalised prototypes).
Teacher outputs are centred (centres averaged over all ranks) and sharpened. The iBOT loss on
masked patch tokens is the dense signal the [CLS]/patch specialisation paper relies on.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.core.schedule import cosine, linear_warmup
from vitreg.errors import SpecError
from vitreg.results.train import DinoOptions, DinoStep, DinoTerms
from vitreg.train.augment import dino_view, normalize, to_tensor, uniform
from vitreg.train.data import dataset_index, generator, read_sample
from vitreg.train.recipe import BatchSpec

__all__ = ["DinoHead", "DinoOptions", "DinoRecipe", "DinoStudent", "loss_terms"]


class DinoHead(nn.Module):
    """MLP -> L2 norm -> prototypes with unit-norm rows (weight norm with the gain fixed at 1)."""

    def __init__(self, dim: int, out_dim: int, hidden_dim: int, bottleneck_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, bottleneck_dim),
        )
        self.prototypes = nn.Parameter(torch.empty(out_dim, bottleneck_dim))
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.prototypes, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = F.normalize(self.mlp(x), dim=-1)
        return F.linear(z, F.normalize(self.prototypes, dim=-1))


def _layout(backbone: nn.Module, x: torch.Tensor) -> TokenLayout:
    """The token layout of the bare timm ViT (training wraps no vitreg Model) on images ``x``."""
    pe = backbone.patch_embed
    n_cls = 0 if getattr(backbone, "cls_token", None) is None else 1
    grid = pe.dynamic_feat_size(tuple(x.shape[-2:]))
    n_reg = int(getattr(backbone, "num_reg_tokens", 0) or 0)
    return TokenLayout(n_cls, n_reg, grid, tuple(pe.patch_size))


def _encode(backbone: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pooled [CLS]-side representation, patch tokens) of a timm ViT."""
    feats = backbone.forward_features(x)
    patches = _layout(backbone, x).take(feats, "patches")
    return backbone.forward_head(feats, pre_logits=True), patches


class DinoStudent(nn.Module):
    """Backbone + head + the mask token that replaces masked patch embeddings (a forward hook)."""

    def __init__(self, backbone: nn.Module, head: DinoHead):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.mask_token = nn.Parameter(torch.zeros(1, backbone.embed_dim))
        self._mask: torch.Tensor | None = None
        self._hook = backbone.patch_embed.register_forward_hook(self._apply_mask)

    def _apply_mask(self, module: nn.Module, inputs: tuple, x: torch.Tensor) -> torch.Tensor | None:
        if self._mask is None:
            return None
        shape = (*x.shape[:-1], 1)  # [B, N, 1], or [B, H, W, 1] with dynamic_img_size
        if self._mask[0].numel() != x[0, ..., 0].numel():
            raise SpecError(
                f"the iBOT mask has {self._mask.shape[1]} patches but patch_embed returned "
                f"{tuple(x.shape)}; the global crop size must match img_size"
            )
        return torch.where(self._mask.view(shape), self.mask_token.to(x.dtype), x)

    def forward(
        self, global_crops: torch.Tensor, local_crops: torch.Tensor | None, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Head outputs: [CLS] of every crop (global first) and the masked global patch tokens."""
        self._mask = masks
        try:
            cls, patches = _encode(self.backbone, global_crops)
        finally:
            self._mask = None
        n_global = cls.shape[0]
        out = self.head(torch.cat([cls, patches[masks]]))
        cls_out, patch_out = out[:n_global], out[n_global:]
        if local_crops is not None:
            local_cls, _ = _encode(self.backbone, local_crops)
            cls_out = torch.cat([cls_out, self.head(local_cls)])
        return cls_out, patch_out


class DinoRecipe:
    """Self-distillation with an EMA teacher; the teacher backbone is the exported model."""

    name = "dino"

    def __init__(self, model: nn.Module, spec: BatchSpec, opts: DinoOptions, total_steps: int):
        self.spec = spec
        self.opts = opts
        self.total_steps = total_steps
        patch = model.patch_embed.patch_size
        self.patch = patch[0] if isinstance(patch, tuple | list) else int(patch)
        if spec.img_size % self.patch:
            raise SpecError(
                f"img_size {spec.img_size} is not a multiple of the patch size {self.patch}"
            )
        self.n_patches = (spec.img_size // self.patch) ** 2
        self.local_size = opts.local_size or max(
            self.patch, round(spec.img_size * 96 / 224 / self.patch) * self.patch
        )
        head = DinoHead(model.embed_dim, opts.out_dim, opts.hidden_dim, opts.bottleneck_dim)
        self.teacher = nn.ModuleDict(
            {"backbone": copy.deepcopy(model), "head": copy.deepcopy(head)}
        )
        self.teacher.requires_grad_(False).eval()
        self.module = DinoStudent(model, head)
        self.center = torch.zeros(1, opts.out_dim)
        self.patch_center = torch.zeros(1, opts.out_dim)
        self._sums: list[torch.Tensor] = []

    def to(self, device: torch.device) -> DinoRecipe:
        self.module.to(device)
        self.teacher.to(device)
        self.center, self.patch_center = self.center.to(device), self.patch_center.to(device)
        return self

    def _mask(self, g: torch.Generator) -> torch.Tensor:
        mask = torch.zeros(self.n_patches, dtype=torch.bool)
        if uniform(g) < self.opts.mask_prob:
            k = max(1, round(uniform(g, *self.opts.mask_ratio) * self.n_patches))
            mask[torch.randperm(self.n_patches, generator=g)[:k]] = True
        return mask

    def batch(self, step: int, positions: range) -> dict[str, torch.Tensor]:
        s, o = self.spec, self.opts
        n_views = 2 + o.n_local_crops
        views: list[list[torch.Tensor]] = [[] for _ in range(n_views)]
        masks: list[list[torch.Tensor]] = [[], []]
        for i in positions:
            index = dataset_index(s.seed, step, i, s.batch_size, len(s.data))
            image = to_tensor(read_sample(s.data, index)[0])
            g = generator(s.seed, "aug", step, i)
            crops = [
                dino_view(image, s.img_size, o.global_scale, g, blur_p=1.0),
                dino_view(image, s.img_size, o.global_scale, g, blur_p=0.1, solarize_p=0.2),
            ]
            crops += [
                dino_view(image, self.local_size, o.local_scale, g, blur_p=0.5)
                for _ in range(o.n_local_crops)
            ]
            for v, crop in zip(views, crops, strict=True):
                v.append(normalize(crop, s.mean, s.std))
            for m in masks:
                m.append(self._mask(g))
        batch = {
            "global": torch.cat([torch.stack(v) for v in views[:2]]),
            "masks": torch.cat([torch.stack(m) for m in masks]),
        }
        if o.n_local_crops:
            batch["local"] = torch.cat([torch.stack(v) for v in views[2:]])
        return batch

    def teacher_temp(self, step: int) -> float:
        warm = round(self.opts.teacher_temp_warmup * self.total_steps)
        return linear_warmup(step, warm, self.opts.teacher_temp_start, self.opts.teacher_temp)

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor], step: int):
        o, masks = self.opts, batch["masks"]
        temp = self.teacher_temp(step)
        with torch.no_grad():
            t_cls, t_patch = _encode(self.teacher["backbone"], batch["global"])
            t_out = self.teacher["head"](torch.cat([t_cls, t_patch[masks]])).float()
        t_cls, t_patch = t_out[: len(t_cls)], t_out[len(t_cls) :]
        self._sums.append(
            torch.cat([t_cls.sum(0), t_patch.sum(0), t_out.new_tensor([len(t_cls), len(t_patch)])])
        )
        s_cls, s_patch = module(batch["global"], batch.get("local"), masks)
        s_cls, s_patch = s_cls.float(), s_patch.float()

        b = len(t_cls) // 2
        teacher = F.softmax((t_cls - self.center) / temp, dim=-1).view(2, b, -1)
        student = F.log_softmax(s_cls / o.student_temp, dim=-1).view(-1, b, s_cls.shape[-1])
        pairs = [(i, j) for i in range(2) for j in range(len(student)) if i != j]
        dino = sum(-(teacher[i] * student[j]).sum(-1).mean() for i, j in pairs) / len(pairs)

        t_p = F.softmax((t_patch - self.patch_center) / temp, dim=-1)
        ce = -(t_p * F.log_softmax(s_patch / o.student_temp, dim=-1)).sum(-1)
        per_image = (1 / masks.sum(1).clamp(min=1)).unsqueeze(1).expand_as(masks)[masks]
        ibot = (ce * per_image).sum() / len(masks)

        loss = o.dino_weight * dino + o.ibot_weight * ibot
        # loss_dino = teacher entropy + KL(teacher || student): near ln(out_dim) the centred,
        # sharpened teacher is close to uniform and the [CLS] loss has little left to teach
        entropy = -torch.special.xlogy(teacher, teacher).sum(-1).mean()
        return loss, {
            "loss_dino": dino.detach(),
            "loss_ibot": ibot.detach(),
            "teacher_entropy": entropy.detach(),
        }

    def end_step(self, step: int, reduce_sum) -> dict[str, float]:
        """EMA teacher update and centre update with teacher outputs of the whole global batch."""
        o = self.opts
        total = reduce_sum(torch.stack(self._sums).sum(0))
        self._sums = []
        k = o.out_dim
        n_cls, n_patch = total[-2].item(), total[-1].item()
        m = o.center_momentum
        self.center.mul_(m).add_(total[:k].view(1, k) / n_cls, alpha=1 - m)
        if n_patch > 0:
            self.patch_center.mul_(m).add_(total[k : 2 * k].view(1, k) / n_patch, alpha=1 - m)
        momentum = cosine(step, self.total_steps, o.momentum, 1.0)
        student = {"backbone": self.module.backbone, "head": self.module.head}
        with torch.no_grad():
            for name, part in student.items():
                for t, s in zip(self.teacher[name].parameters(), part.parameters(), strict=True):
                    t.mul_(momentum).add_(s.detach(), alpha=1 - momentum)
        return {"teacher_temp": self.teacher_temp(step), "momentum": momentum}

    def extra_state(self) -> dict[str, torch.Tensor]:
        state = {f"teacher.{k}": v for k, v in self.teacher.state_dict().items()}
        return {**state, "center": self.center, "patch_center": self.patch_center}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        teacher = {k[len("teacher.") :]: v for k, v in state.items() if k.startswith("teacher.")}
        self.teacher.load_state_dict(teacher)
        self.center.copy_(state["center"])
        self.patch_center.copy_(state["patch_center"])

    def export(self) -> nn.Module:
        return self.teacher["backbone"]


def loss_terms(history: list[dict[str, float]], options: DinoOptions) -> DinoTerms | None:
    """What the [CLS] DINO loss did over a run, from its step records: its lowest value and
    where, its final value, and the teacher's entropy there against ``ln(out_dim)`` (a uniform
    teacher; ``options`` are the run's recipe options); ``loss_dino - teacher_entropy`` is
    KL(teacher || student). ``None`` for a log without the teacher's entropy."""
    rows = [r for r in history if "loss_dino" in r and "teacher_entropy" in r]
    if not rows:
        return None
    low = min(rows, key=lambda r: r["loss_dino"])
    last = rows[-1]
    return DinoTerms(
        out_dim=options.out_dim,
        ln_out_dim=math.log(options.out_dim),
        lowest=DinoStep(step=int(low["step"]), loss_dino=low["loss_dino"]),
        final=DinoStep(
            step=int(last["step"]),
            loss_dino=last["loss_dino"],
            teacher_entropy=last["teacher_entropy"],
            kl=last["loss_dino"] - last["teacher_entropy"],
        ),
    )
