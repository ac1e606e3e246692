"""What token artifacts do to a sparse autoencoder: the same TopK SAE (:mod:`.sae_model`)
trained on (a) the raw model's patch tokens, (b) the same with the outlier tokens left out, and
(c) the fixed model's patch tokens, evaluated on held-out images.

Definitions (every arm, every seed):

* outlier tokens: patch tokens whose norm in the *raw* model is above diagnose's ``auto`` rule
  (the valley of a two-component mixture of log norms, fitted once on all images' raw patch
  norms at the site); their positions are the outlier positions in the fixed model too;
  ordinary patches are the other patch tokens;
* ordinary error: squared reconstruction error on the held-out ordinary patches over their
  total variance (fraction of variance unexplained): arms (a) and (b) on the raw model's tokens,
  arm (c) on the fixed model's tokens of the same images and positions;
* dead latents: the share of latents never active on the arm's held-out patch tokens (raw for
  (a) and (b), fixed for (c));
* outlier latents: the share of latents for which more than :data:`MAJORITY` of the held-out
  tokens they fire on are at outlier positions (counted, not weighted by activation: an outlier
  token's norm gives every latent it touches a large activation, even in an SAE that never saw
  one, so activation mass would call a latent outlier-dominated for one outlier token);
* outlier loss share: squared error on the outlier positions over the squared error on all
  held-out patch tokens ((a) and (c); (b) never sees an outlier token, so it has none).

Each seed draws its own split of the images (``held_out`` of them held out) and its own SAE
initialisation and minibatches, the same for the three arms; a measure is the mean over seeds
with the Student-t 95% half-width, as the probe reports give theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from vitreg.analysis.rules import threshold
from vitreg.errors import InputError
from vitreg.experiment.sae_data import Activations
from vitreg.experiment.sae_model import TopKSae, train_sae
from vitreg.probe.metrics import mean_ci
from vitreg.progress import SILENT, Progress
from vitreg.results.fix import NeuronsUsed
from vitreg.results.sae import MEASURES, ArmName, SaeArm, SaeResults, SeedMeasure
from vitreg.settings.sae import SaeSettings

MAJORITY = 0.5  # an outlier latent fires on outlier tokens more often than this share
MIN_IMAGES = 4  # fewer images leave no split with both training and held-out images
OUTLIER_RULE = (
    "diagnose's auto rule on the raw model's patch norms at the site: the valley of a "
    "two-component Gaussian mixture of log norms (nothing flagged unless they are bimodal)"
)
TRAINED_ON = {
    "raw": "every patch token of the raw model",
    "excluded": "the raw model's patch tokens, outlier tokens left out",
    "fixed": "every patch token of the fixed model",
}


@dataclass(frozen=True)
class Split:
    """The images one seed trains on and holds out (indices)."""

    train: torch.Tensor
    held: torch.Tensor


def split_images(n_images: int, held_out: float, seed: int) -> Split:
    """A random split of ``n_images`` seeded by ``seed``: ``held_out`` of them (at least one)
    held out, the rest (at least one) for training."""
    n_held = min(max(1, round(held_out * n_images)), n_images - 1)
    order = torch.randperm(n_images, generator=torch.Generator().manual_seed(seed))
    return Split(order[n_held:], order[:n_held])


def outlier_cut(raw: torch.Tensor, site: str) -> float:
    """The norm above which a raw patch token is an outlier (diagnose's ``auto`` rule), or an
    :class:`InputError` when nothing at ``site`` is an outlier."""
    cut = threshold(raw.norm(dim=-1).flatten().cpu().numpy(), "auto")
    if not math.isfinite(cut):
        raise InputError(
            f"no outlier tokens at {site}: the raw model's patch norms there have no outlier "
            "mode, so there is nothing for the study to compare; pick the block where "
            "`vitreg diagnose` finds the outliers with --layer, or a model with artifacts"
        )
    return cut


@dataclass(frozen=True)
class ArmScore:
    """One arm's four measures for one seed (``loss_share`` None: no outlier token trained)."""

    ordinary_error: float
    dead_latents: float
    outlier_latents: float
    outlier_loss_share: float | None


@torch.no_grad()
def score(sae: TopKSae, x: torch.Tensor, outlier: torch.Tensor, saw_outliers: bool) -> ArmScore:
    """The measures of ``sae`` on held-out tokens ``x [T, C]`` with the outlier positions
    ``outlier [T]`` (see the module docstring)."""
    x_hat, z = sae(x)
    sq = (x_hat - x).pow(2).sum(1)
    ordinary = x[~outlier]
    variance = (ordinary - ordinary.mean(0)).pow(2).sum()
    fires = (z > 0).float()
    count = fires.sum(0)
    dominated = (count > 0) & (fires[outlier].sum(0) > MAJORITY * count)
    total = float(sq.sum())
    share = float(sq[outlier].sum()) / total if saw_outliers and total > 0 else None
    return ArmScore(
        ordinary_error=float(sq[~outlier].sum() / variance.clamp_min(1e-12)),
        dead_latents=float((count == 0).float().mean()),
        outlier_latents=float(dominated.float().mean()),
        outlier_loss_share=share,
    )


def seed_scores(
    acts: Activations, outliers: torch.Tensor, settings: SaeSettings, seed: int
) -> tuple[dict[ArmName, ArmScore], dict[ArmName, int], float]:
    """Every arm's measures for ``seed``, its training-token counts, and the share of held-out
    patch tokens that are outliers."""
    split = split_images(len(acts.raw), settings.held_out, seed)
    width = acts.raw.shape[-1]
    held_mask = outliers[split.held].reshape(-1)
    train_mask = outliers[split.train].reshape(-1)
    raw_train = acts.raw[split.train].reshape(-1, width)
    training: dict[ArmName, torch.Tensor] = {
        "raw": raw_train,
        "excluded": raw_train[~train_mask],
        "fixed": acts.fixed[split.train].reshape(-1, width),
    }
    scores: dict[ArmName, ArmScore] = {}
    for arm, tokens in training.items():
        sae = train_sae(tokens, settings, seed)
        held = acts.fixed if arm == "fixed" else acts.raw
        scores[arm] = score(sae, held[split.held].reshape(-1, width), held_mask, arm != "excluded")
    counts: dict[ArmName, int] = {arm: len(t) for arm, t in training.items()}
    return scores, counts, float(held_mask.float().mean())


def over_seeds(values: list[float | None]) -> SeedMeasure:
    """Mean and 95% half-width of one measure over the seeds (None where it is undefined)."""
    mean, ci = mean_ci([v for v in values if v is not None])
    return SeedMeasure(
        mean=mean if math.isfinite(mean) else None,
        ci95=ci if math.isfinite(ci) else None,
        values=values,
    )


def check_images(acts: Activations) -> None:
    """Enough images for a split with training and held-out images, and patch tokens."""
    n = len(acts.raw)
    if n < MIN_IMAGES:
        raise InputError(
            f"the SAE study needs at least {MIN_IMAGES} images (some to train on, some held "
            f"out), got {n}: pass more images (--limit, --images DIR)"
        )


def sae_study(
    acts: Activations,
    settings: SaeSettings,
    neurons: NeuronsUsed,
    progress: Progress = SILENT,
    device: str | None = None,
) -> SaeResults:
    """The three arms on ``acts`` (raw and fixed patch tokens of the same images) with the SAE
    recipe ``settings`` over its seeds, trained on ``device`` (default: where ``acts`` are);
    ``neurons`` are the fix's, as the results record them."""
    check_images(acts)
    if device is not None:
        acts = replace(acts, raw=acts.raw.to(device), fixed=acts.fixed.to(device))
    cut = outlier_cut(acts.raw, acts.site)
    outliers = acts.raw.norm(dim=-1) > cut  # [n_images, P]
    per_seed: list[dict[ArmName, ArmScore]] = []
    counts: dict[ArmName, list[int]] = {arm: [] for arm in TRAINED_ON}
    shares: list[float | None] = []
    with progress(settings.seeds, "training the SAEs (3 arms per seed)") as update:
        for seed in range(settings.seeds):
            scores, n_tokens, share = seed_scores(acts, outliers, settings, seed)
            per_seed.append(scores)
            shares.append(share)
            for arm, n in n_tokens.items():
                counts[arm].append(n)
            update(seed + 1)
    arms = [
        SaeArm(
            name=arm,
            trained_on=TRAINED_ON[arm],
            train_tokens=counts[arm],
            **{m: measure(per_seed, arm, m) for m in MEASURES},
        )
        for arm in TRAINED_ON
    ]
    return SaeResults(
        site=acts.site,
        layer=acts.layer,
        outlier_rule=OUTLIER_RULE,
        outlier_threshold=cut,
        outlier_tokens=over_seeds(shares),
        n_images=len(acts.raw),
        held_out_images=len(split_images(len(acts.raw), settings.held_out, 0).held),
        patches_per_image=acts.raw.shape[1],
        n_latents=settings.expansion * acts.raw.shape[-1],
        sae=settings,
        neurons=neurons,
        arms=arms,
    )


def measure(per_seed: list[dict[ArmName, ArmScore]], arm: ArmName, name: str) -> SeedMeasure | None:
    """One measure of ``arm`` over the seeds (None: undefined in every seed)."""
    values: list[float | None] = [getattr(s[arm], name) for s in per_seed]
    return None if all(v is None for v in values) else over_seeds(values)
