"""The model to train: a timm ViT instance, a timm / vitreg variant name, or a variant spec."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from torch import nn

from vitreg.errors import InputError, SpecError, UnsupportedModelError
from vitreg.models.input_size import enable_dynamic_size
from vitreg.results.base import Setting, as_setting
from vitreg.results.train import TrainedIdentity, TrainedInstance, TrainedModel, TrainedVariant

VIT_API = ("patch_embed", "forward_features", "forward_head", "num_prefix_tokens", "embed_dim")


def _register_variants() -> None:
    """Import ``vitreg.arch.registry`` (when present) so ``vitreg_*`` names are in timm's registry."""
    try:
        importlib.import_module("vitreg.arch.registry")
    except ImportError:
        return


def describe(model_or_spec: Any, kwargs: Mapping[str, Any]) -> TrainedIdentity:
    """The identity of the model argument (compared on resume): a timm name, a variant spec
    (values other than plain ones and lists of them as their ``repr``) or an instance; the
    keyword arguments as :func:`~vitreg.results.base.as_setting` reads them."""
    if isinstance(model_or_spec, nn.Module):
        n = sum(p.numel() for p in model_or_spec.parameters())
        return TrainedInstance(instance=type(model_or_spec).__name__, params=n)
    given = {str(k): as_setting(v) for k, v in kwargs.items()}
    if isinstance(model_or_spec, Mapping):
        variant = {str(k): _plain(v) for k, v in model_or_spec.items()}
        return TrainedVariant(variant=variant, kwargs=given)
    return TrainedModel(name=str(model_or_spec), kwargs=given)


def _plain(v: Any) -> Setting:
    """A variant option as a setting: plain values and lists of them as they are, else its repr."""
    plain = str | int | float | bool | type(None)
    if isinstance(v, plain) or (isinstance(v, list) and all(isinstance(x, plain) for x in v)):
        return v  # type: ignore[no-any-return]
    return repr(v)


def build_model(
    model_or_spec: Any,
    *,
    dynamic: bool,
    img_size: int | None,
    num_classes: int,
    kwargs: Mapping[str, Any] | None = None,
) -> nn.Module:
    """A timm ViT with ``num_classes`` outputs (0 = features only), dynamic input size if asked."""
    kwargs = dict(kwargs or {})
    refuse_file_args(kwargs)
    if isinstance(model_or_spec, nn.Module):
        model = model_or_spec
    else:
        build = {"pretrained": False, "num_classes": num_classes, **kwargs}
        if img_size is not None:
            build["img_size"] = img_size
        if dynamic:
            build["dynamic_img_size"] = True
        check_build(model_or_spec, build)
        model = _create(model_or_spec, build)
    missing = [a for a in VIT_API if not hasattr(model, a)]
    if missing:
        raise UnsupportedModelError(
            f"training needs a timm VisionTransformer-like model; {type(model).__name__} lacks "
            f"{', '.join(missing)}. Pass a timm ViT name (e.g. vit_tiny_patch16_224) or instance"
        )
    if getattr(model, "num_classes", num_classes) != num_classes:
        model.reset_classifier(num_classes)
    if dynamic and not getattr(model, "dynamic_img_size", False):
        enable_dynamic_size(model)
    return model


def refuse_file_args(kwargs: Mapping[str, Any]) -> None:
    """Refuse constructor arguments that make timm read a file or decide on weights
    (``checkpoint_path``, ``pretrained_cfg_overlay``, ...), whoever passes them."""
    from vitreg.models.loaders.local import REFUSED_ARGS

    refused = sorted(set(kwargs) & set(REFUSED_ARGS))
    if refused:
        key = refused[0]
        raise InputError(f"the model argument {key} is refused: {REFUSED_ARGS[key]}")


def check_build(spec: Any, build: dict[str, Any]) -> None:
    """Build ``spec`` on the meta device first (nothing allocated): a model above
    :data:`~vitreg.models.loaders.local.MAX_PARAMS` or an input size it cannot take
    (``--img-size``, ``--model-arg img_size``) is an :class:`InputError` before any memory is
    spent on it."""
    import torch

    from vitreg.models.input_size import check_built_size
    from vitreg.models.loaders.local import MAX_PARAMS

    try:
        with torch.device("meta"):
            meta = _create(spec, build)
    except (SpecError, UnsupportedModelError):
        raise
    except (TypeError, ValueError, AssertionError) as e:  # timm's own argument checks
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise InputError(
            f"--model-arg: {spec} cannot be built with {sorted(build)} "
            f"({type(e).__name__}: {first}); check each value against timm's {spec}"
        ) from None
    except Exception:  # some builds need real tensors: the real build decides
        return
    n = sum(t.numel() for t in meta.parameters())
    if n > MAX_PARAMS:
        raise InputError(
            f"--model-arg {sorted(build)}: {spec} would have about {n / 1e9:.1f} billion "
            f"parameters, above the {MAX_PARAMS / 1e9:.0f} billion vitreg trains; check depth, "
            "embed_dim and mlp_ratio"
        )
    check_built_size(meta, str(spec))


def _create(spec: Any, build: dict[str, Any]) -> nn.Module:
    import timm

    if isinstance(spec, Mapping):
        try:
            from vitreg.arch import create_variant
        except ImportError:
            raise SpecError("variant specs need vitreg.arch, which is not available") from None
        options = dict(spec)
        base = options.pop("base", None)
        if base is None:
            raise SpecError(
                "a variant spec needs 'base' (a timm ViT name), e.g. {'base': 'vit_tiny_patch16_224', 'registers': 4}"
            )
        return create_variant(base, **options, **build)
    if not isinstance(spec, str):
        raise SpecError(
            f"expected a model, a timm name or a variant spec, got {type(spec).__name__}"
        )
    _register_variants()
    if not timm.is_model(spec):
        close = timm.list_models(f"*{spec.split('_')[0]}*")[:5]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise SpecError(
            f"unknown model {spec!r}{hint}; pass a timm ViT name such as vit_tiny_patch16_224 "
            "or a vitreg variant name (timm.list_models('vitreg_*'))"
        )
    try:
        return timm.create_model(spec, **build)
    except TypeError as e:
        raise SpecError(f"cannot build {spec!r} with {sorted(build)}: {e}") from None
