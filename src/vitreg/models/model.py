"""Model: the source module plus its adapter -- hooks, caching, streaming traces, token insertion."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import nn

from vitreg import distributed
from vitreg.core.layout import TokenLayout
from vitreg.core.weights import WEIGHT_KINDS
from vitreg.errors import HookError, InputError
from vitreg.hooks.cache import ActivationCache
from vitreg.hooks.reducers import Reducer
from vitreg.hooks.sites import Handle, HookContext, HookFn, Site
from vitreg.hooks.streamed import mark_streamed
from vitreg.models.adapters.base import Adapter, adapter_for
from vitreg.progress import Update
from vitreg.results.schema import ModelDescription

if TYPE_CHECKING:
    from vitreg.core.checkpoint import Pass, PassState
    from vitreg.models.compiled import Backend, CompiledForward

NameFilter = str | Sequence[str] | Callable[[str], bool] | None


class _StopForward(Exception):  # noqa: N818 - control flow, never seen by callers
    """Ends a forward pass at ``stop_at_layer``; carries the residual stream reached there."""

    def __init__(self, owner: object, value: torch.Tensor) -> None:
        super().__init__("stop_at_layer reached")
        self.owner = owner
        self.value = value


@dataclass
class TraceResult:
    """What ``Model.trace`` kept: the reducers (fed), the image count and provenance."""

    reducers: list[Reducer]
    n_images: int
    layouts: dict[str, TokenLayout | None] = field(default_factory=dict)
    attn_source: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, site: str) -> list[Reducer]:
        found = [r for r in self.reducers if r.site == site]
        if not found:
            raise HookError(f"no reducer was attached to {site!r}")
        return found


def iter_batches(data: Any, batch_size: int, limit: int | None = None) -> Iterable[torch.Tensor]:
    """Image batches from a tensor, a DataLoader, or an iterable of tensors/tuples/dicts,
    cut so that at most ``limit`` images come out in total."""
    done = 0
    for batch in _raw_batches(data, batch_size):
        if limit is not None:
            if done >= limit:
                return
            batch = batch[: limit - done]
        done += batch.shape[0]
        yield batch


def _raw_batches(data: Any, batch_size: int) -> Iterable[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        if data.dim() == 3:
            data = data.unsqueeze(0)
        yield from data.split(batch_size)
        return
    for item in data:
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (tuple, list)) and item and isinstance(item[0], torch.Tensor):
            yield item[0]
        elif isinstance(item, dict) and isinstance(item.get("image"), torch.Tensor):
            yield item["image"]
        else:
            raise InputError(
                f"trace() got a batch of type {type(item).__name__}; yield image tensors "
                "[B, 3, H, W], (images, ...) tuples or {'image': images} dicts"
            )


class TraceState(TypedDict):
    """A checkpoint of ``Model.trace``: each reducer's statistics, and by site the layout and
    attention source seen so far."""

    reducers: list[PassState]
    layouts: dict[str, TokenLayout | None]
    sources: dict[str, str]


def trace_state(
    reducers: Sequence[Reducer],
    layouts: dict[str, TokenLayout | None],
    sources: dict[str, str],
) -> TraceState:
    """What a checkpoint of ``Model.trace`` keeps: every reducer's statistics (this rank's, not
    merged) and the layouts and attention sources seen so far."""
    from vitreg.core.checkpoint import state_of

    return {"reducers": [state_of(r) for r in reducers], "layouts": layouts, "sources": sources}


def resume_trace(
    reducers: Sequence[Reducer],
    batch_size: int,
    limit: int | None,
    attention: str,
    stop: int | None,
    layouts: dict[str, TokenLayout | None],
    sources: dict[str, str],
    independent: bool = False,
) -> tuple[Pass | None, int, bool]:
    """The checkpoint of this trace inside ``vitreg.core.checkpoint.resumable`` (else ``None``),
    the images its saved state covers (restored into ``reducers``, ``layouts`` and ``sources``)
    and whether the pass had finished. ``independent``: the ranks read their own images
    (:class:`vitreg.distributed.RankSplit`), so each resumes from its own last state."""
    from vitreg.core.checkpoint import next_pass, restore_into

    key = {
        "kind": "trace",
        "reducers": [[type(r).__name__, *r.sites] for r in reducers],
        "batch_size": batch_size,
        "limit": limit,
        "attention": attention,
        "stop_at_layer": stop,
    }
    if independent:
        key["split"] = "by rank"
    ckpt = next_pass(key)
    if ckpt is None:
        return None, 0, False
    seen, finished, state = ckpt.resume(together=not independent)
    if state is not None:
        for r, saved in zip(reducers, state["reducers"], strict=True):
            restore_into(r, saved)
        layouts.update(state["layouts"])
        sources.update(state["sources"])
    return ckpt, seen, finished


def weights_of(module: nn.Module) -> str:
    """The weight kind a module carries (set when vitreg loaded it; planted fixtures say so);
    a module vitreg did not load holds the user's weights."""
    kind = getattr(module, "vitreg_weights", None)
    return kind if kind in WEIGHT_KINDS else "user"


class Model:
    """A source ViT (timm, HF, open_clip module) with vitreg's hooks, layout and preprocessing.

    ``module`` is the untouched source model; with no hook that edits values, every output is
    the source's own.
    """

    def __init__(
        self,
        module: nn.Module,
        adapter: Adapter | None = None,
        *,
        spec: str | None = None,
        transform: Callable | None = None,
        weights: str | None = None,
    ) -> None:
        self.module = module
        self.adapter = adapter or adapter_for(module)
        self.spec = spec
        self.weights = weights or weights_of(module)
        self._transform = transform
        self._image_size: tuple[int, int] | None = None
        self._n_extra = 0
        self._insertion: Handle | None = None
        self._compiled: CompiledForward | None = None
        self.adapter.input_module().register_forward_pre_hook(self._record_input)

    # description ----------------------------------------------------------------
    @property
    def weights(self) -> str:
        """Where the weights come from: one of :data:`WEIGHT_KINDS` (set by how it was loaded)."""
        return self._weights

    @weights.setter
    def weights(self, kind: str) -> None:
        if kind not in WEIGHT_KINDS:
            raise InputError(f"weights must be one of {sorted(WEIGHT_KINDS)}, got {kind!r}")
        self._weights = kind
        self.module.vitreg_weights = kind  # travels with the module (save_local records it)

    @property
    def family(self) -> str:
        return self.adapter.family

    @property
    def notes(self) -> list[str]:
        return self.adapter.notes

    @property
    def n_layers(self) -> int:
        return self.adapter.n_layers

    @property
    def d_model(self) -> int:
        return self.adapter.d_model

    @property
    def d_mlp(self) -> int:
        return self.adapter.d_mlp

    @property
    def n_heads(self) -> int:
        return self.adapter.n_heads

    @property
    def layout(self) -> TokenLayout:
        """Token layout of the last input seen (default input size before any), inserted tokens included."""
        return self.adapter.layout_for(self._image_size).with_extra(self._n_extra)

    def layout_for(self, image_size: tuple[int, int]) -> TokenLayout:
        return self.adapter.layout_for(image_size).with_extra(self._n_extra)

    @property
    def transform(self) -> Callable:
        """The eval preprocessing the source model expects (PIL image -> tensor)."""
        if self._transform is None:
            self._transform = self.adapter.transform()
        return self._transform

    def preprocess(self, images: Any) -> torch.Tensor:
        """PIL image(s) -> ``[B, 3, H, W]`` batch through :attr:`transform`; images must be RGB."""
        batch = images if isinstance(images, (list, tuple)) else [images]
        for i, img in enumerate(batch):
            mode = getattr(img, "mode", None)
            if not isinstance(mode, str):
                raise InputError(f"preprocess takes PIL images, got {type(img).__name__} at {i}")
            if mode != "RGB":
                raise InputError(
                    f"image {i} has mode {mode!r}, not RGB; convert it with img.convert('RGB') "
                    "(grayscale and RGBA inputs change what the model sees, so vitreg won't guess)"
                )
        return torch.stack([self.transform(img) for img in batch])

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    def to(
        self, device: str | torch.device | None = None, dtype: torch.dtype | None = None
    ) -> Model:
        self.module.to(device=device, dtype=dtype)
        return self

    def eval(self) -> Model:
        self.module.eval()
        return self

    def describe(self) -> ModelDescription:
        """What this model is: spec, weights, family, dims, layout, attention path, notes."""
        return ModelDescription(
            spec=self.spec,
            weights=self.weights,
            family=self.family,
            source=self.adapter.source,
            class_name=f"{type(self.module).__module__}.{type(self.module).__name__}",
            n_layers=self.n_layers,
            d_model=self.d_model,
            d_mlp=self.d_mlp,
            n_heads=self.n_heads,
            n_params=sum(p.numel() for p in self.module.parameters()),
            image_size=list(self.adapter.default_image_size()),
            layout=self.adapter.base_layout().to_dict(),
            attention=self.adapter.attention_path(),
            supports_insertion=self.adapter.supports_insertion,
            notes=list(self.notes),
        )

    # hooks ------------------------------------------------------------------------
    def hook_names(self) -> list[str]:
        """Canonical hook names in forward order."""
        return list(self.adapter.sites())

    def resolve(self, names: NameFilter) -> list[str]:
        """Names matching an exact name, a glob (``blocks.*.hook_resid_post``), a list or a filter."""
        all_names = self.hook_names()
        if names is None:
            return all_names
        if callable(names):
            return [n for n in all_names if names(n)]
        patterns = [names] if isinstance(names, str) else list(names)
        chosen: list[str] = []
        for pattern in patterns:
            hits = [n for n in all_names if fnmatchcase(n, pattern)]
            if not hits:
                close = difflib.get_close_matches(pattern, all_names, n=3)
                hint = f"; did you mean {close}?" if close else "; see model.hook_names()"
                raise HookError(f"no hook named {pattern!r} on this {self.family} model{hint}")
            chosen += [n for n in hits if n not in chosen]
        return [n for n in all_names if n in chosen]

    def site(self, name: str) -> Site:
        """The site behind one exact canonical name."""
        if name not in self.adapter.sites():
            self.resolve(name)  # raises with suggestions
            raise HookError(f"{name!r} is a pattern; site() takes one exact hook name")
        return self.adapter.sites()[name]

    def add_hook(self, names: NameFilter, fn: HookFn, attention: str = "auto") -> Handle:
        """Attach ``fn(tensor, hook)`` to every matching site; returns a removable handle."""
        handle = Handle()
        for name in self.resolve(names):
            handle.add(self.site(name).attach(fn, lambda: self.layout, attention).remove)
        return handle

    def hooks(self, fwd_hooks: Sequence[tuple[str, HookFn]], attention: str = "auto") -> Handle:
        """Attach several ``(name, fn)`` pairs at once; use as a context manager."""
        handle = Handle()
        try:
            for name, fn in fwd_hooks:
                handle.add(self.add_hook(name, fn, attention).remove)
        except Exception:
            handle.remove()
            raise
        return handle

    # running ------------------------------------------------------------------------
    def _record_input(self, _mod: nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
            x = args[0]
            # NHWC inputs never reach an input module; channels-first images do
            self._image_size = (int(x.shape[-2]), int(x.shape[-1]))

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        self.adapter.check_images(x)
        return x.to(device=self.device, dtype=self.dtype)

    def features(self, x: torch.Tensor, *, stop_at_layer: int | None = None) -> torch.Tensor:
        """Final token sequence ``[B, N, C]`` after the final norm, inserted tokens removed.

        ``stop_at_layer=k`` (TransformerLens' name and meaning) runs blocks ``0..k-1`` only:
        the pass ends where block ``k`` would start, and the residual stream entering it is
        returned instead (what ``hook_resid_pre`` of block ``k`` sees: the output of block
        ``k-1``, or after a hierarchical stage's patch merging; ``k=0``: the tokens entering
        block 0; ``k = n_layers``: the output of the last block, with no final norm), as
        ``[B, N, C]`` with inserted tokens removed (stage grids flattened row-major).
        Negative ``k`` counts from the end (``-1``: every block but the last); ``None`` runs
        the whole model. Nothing of block ``k`` and later runs, so their hooks never fire --
        except, for ``k=0``, hooks attached beforehand at ``blocks.0.hook_resid_pre``, the
        point where ``hook_tokens`` reads (runs started with ``stop_at_layer`` do not attach
        the hooks of blocks ``>= k``). :meth:`stop_layer` gives the smallest ``k`` that serves
        a set of sites; nothing ever stops unless ``stop_at_layer`` is passed.
        """
        x = self._prepare(x)
        if stop_at_layer is None:
            tokens = self._forward(x)
            return tokens if self.adapter.strips_extra else self.layout.strip_extra(tokens)
        return self._features_until(x, self.stop_index(stop_at_layer))

    def stop_index(self, stop_at_layer: int) -> int:
        """``stop_at_layer`` as a block count in ``0..n_layers``, or a clear :class:`InputError`."""
        n = self.n_layers
        if isinstance(stop_at_layer, bool) or not isinstance(stop_at_layer, int):
            raise InputError(
                f"stop_at_layer takes an int (blocks to run) or None, got {stop_at_layer!r}"
            )
        k = stop_at_layer + n if stop_at_layer < 0 else stop_at_layer
        if not 0 <= k <= n:
            raise InputError(
                f"stop_at_layer={stop_at_layer} is outside this {n}-block model: take 0..{n} "
                f"(run blocks 0..k-1), -{n}..-1 from the end, or None for the whole model"
            )
        return k

    def stop_layer(self, names: NameFilter) -> int | None:
        """The smallest ``stop_at_layer`` whose run still reaches every site of ``names``.

        A site of block ``i`` needs ``i + 1``; sites before the blocks (``hook_embed``,
        ``hook_tokens``) need 0; a site between blocks (a hierarchical stage output) needs the
        blocks before it; ``None`` when a site needs the whole forward pass (the final norm).
        Nothing stops unless the caller passes this on.
        """
        chosen = set(self.resolve(names))
        sites = list(self.adapter.sites().items())
        need, started = 0, False
        for i, (name, site) in enumerate(sites):
            started = started or site.layer is not None
            if name not in chosen:
                continue
            if site.layer is not None:
                need = max(need, site.layer + 1)
            elif started:  # between blocks: it runs before the next block starts
                after = next((s.layer for _, s in sites[i + 1 :] if s.layer is not None), None)
                if after is None:
                    return None
                need = max(need, after)
        return need

    def _block_site(self, layer: int, suffix: str) -> Site:
        for name, site in self.adapter.sites().items():
            if site.layer == layer and name.endswith(f".{suffix}"):
                return site
        raise HookError(
            f"this {self.family} model has no {suffix} site for block {layer}, so stop_at_layer "
            "cannot end its forward pass there"
        )

    def _features_until(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Run blocks ``0..k-1`` of ``x`` (prepared); the residual stream after them.

        A hook at the input of block ``k`` (its ``hook_resid_pre`` site) raises an exception
        that ends the pass; it is removed before this returns. For ``k >= 1`` it fires before
        any other hook of block ``k``; for ``k = 0`` after every other hook there, so inserted
        tokens and ``hook_tokens`` edits are in. ``k = n_layers`` ends at the output of the
        last block (``hook_resid_post``), after the hooks there.
        """
        owner = object()

        def stop(t: torch.Tensor, hook: HookContext) -> None:
            raise _StopForward(owner, t)

        site: Site
        if k == self.n_layers:
            site = self._block_site(k - 1, "hook_resid_post")
        else:
            site = self._block_site(k, "hook_resid_pre")
            if k > 0:
                site = replace(site, prepend=True)  # block k's own hooks never see it
        handle = site.attach(stop, lambda: self.layout)
        try:
            self._forward(x)
        except _StopForward as e:
            if e.owner is not owner:
                raise
            value = e.value
        else:  # pragma: no cover - the site belongs to a block every forward runs
            raise HookError(f"the forward pass never reached {site.name!r}")
        finally:
            handle.remove()
        if self.adapter.hierarchical:
            return value.flatten(1, 2) if value.dim() == 4 else value
        return self.layout.strip_extra(value)

    def _until(
        self, fwd_hooks: Sequence[tuple[str, HookFn]], k: int | None
    ) -> list[tuple[str, HookFn]]:
        """``fwd_hooks`` without the sites of blocks ``k`` and later (they never run)."""
        if k is None:
            return list(fwd_hooks)
        return [
            (name, fn)
            for pattern, fn in fwd_hooks
            for name in self.resolve(pattern)
            if (layer := self.site(name).layer) is None or layer < k
        ]

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's features of ``x`` (prepared), compiled after :meth:`compile`."""
        if self._compiled is None:
            return self.adapter.features(x)
        return self._compiled(x)

    def compile(self, backend: Backend | None = None, mode: str | None = None) -> CompiledForward:
        """From now on every traced forward (:meth:`features`, :meth:`run_with_cache`,
        :meth:`trace`) runs through ``torch.compile(backend=..., mode=...)`` (inductor unless
        given: :data:`~vitreg.models.compiled.DEFAULT_BACKEND`); hooks run eagerly between the
        compiled pieces (:mod:`vitreg.models.compiled`). Returns the handle: its
        ``report`` counts graphs, graph breaks and frames that fell back to eager, and
        ``remove()`` (or the end of a ``with`` block) goes back to the eager forward. A backend
        that cannot run here raises :class:`~vitreg.models.compiled.CompileError`."""
        from vitreg.hooks.attention import PatternSite
        from vitreg.models import compiled as compiling

        if self._compiled is not None:
            raise HookError("this model's forward is already compiled; remove that handle first")
        sites = self.adapter.sites().values()
        attns = [s.attn for s in sites if isinstance(s, PatternSite) and s.attn is not None]
        unique = list({id(a): a for a in attns}.values())
        chosen = compiling.DEFAULT_BACKEND if backend is None else backend
        compiled = compiling.CompiledForward(
            self.module, self.adapter.features, unique, chosen, mode
        )
        compiled.add(lambda: setattr(self, "_compiled", None))
        self._compiled = compiled
        return compiled

    @property
    def compiled(self) -> CompiledForward | None:
        """The compiled forward in use (see :meth:`compile`), or ``None``."""
        return self._compiled

    def __call__(self, x: torch.Tensor) -> Any:
        """The source model's own forward (pooled embedding, logits, HF output object)."""
        return self.adapter.forward(self._prepare(x))

    def run_with_hooks(
        self,
        x: torch.Tensor,
        fwd_hooks: Sequence[tuple[str, HookFn]],
        attention: str = "auto",
        stop_at_layer: int | None = None,
    ) -> torch.Tensor:
        """``features(x, stop_at_layer=...)`` with the given hooks attached for this call only
        (hooks of blocks ``stop_at_layer`` and later are not attached: they would never run)."""
        k = None if stop_at_layer is None else self.stop_index(stop_at_layer)
        with self.hooks(self._until(fwd_hooks, k), attention):
            return self.features(x, stop_at_layer=k)

    def run_with_cache(
        self,
        x: torch.Tensor,
        names: NameFilter = None,
        reduce: str | Callable[[torch.Tensor, HookContext], torch.Tensor] | None = None,
        device: str | torch.device | None = "cpu",
        attention: str = "auto",
        stop_at_layer: int | None = None,
    ) -> tuple[torch.Tensor, ActivationCache]:
        """Run ``features(x)`` and record the named sites.

        ``reduce='norm'`` stores per-token L2 norms (float32) instead of full activations; a
        callable ``reduce(tensor, hook)`` stores whatever it returns. Tensors are detached and
        moved to ``device`` (``None`` keeps them where they are).

        ``stop_at_layer=k`` runs blocks ``0..k-1`` only (see :meth:`features`): the first value
        returned is then the residual stream after block ``k-1``, not the final-norm output,
        and the cache holds the named sites that ran (those of blocks ``< k`` and before the
        blocks). It never stops by itself: pass :meth:`stop_layer` of ``names`` to stop as soon
        as every named site has run.
        """
        from vitreg.hooks.reducers import token_norms

        if isinstance(reduce, str) and reduce != "norm":
            raise HookError(f"reduce must be None, 'norm' or a callable, got {reduce!r}")
        store: dict[str, torch.Tensor] = {}
        layouts: dict[str, TokenLayout | None] = {}
        sources: dict[str, str] = {}

        def save(t: torch.Tensor, hook: HookContext) -> None:
            if reduce == "norm":
                value = token_norms(t)
            elif callable(reduce):
                value = reduce(t, hook)
            else:
                value = t
            value = value.detach()
            if value.untyped_storage().nbytes() > value.nbytes:  # a view would pin its whole base
                value = value.clone()
            store[hook.name] = value.to(device) if device is not None else value
            layouts[hook.name] = hook.layout
            if hook.attn_source is not None:
                sources[hook.name] = hook.attn_source

        chosen = self.resolve(names)
        k = None if stop_at_layer is None else self.stop_index(stop_at_layer)
        with torch.no_grad(), self.hooks(self._until([(n, save) for n in chosen], k), attention):
            out = self.features(x, stop_at_layer=k)
        ordered = {n: store[n] for n in chosen if n in store}
        return out, ActivationCache(ordered, layouts, sources)

    def trace(
        self,
        data: Any,
        reducers: Sequence[Reducer],
        batch_size: int = 32,
        attention: str = "auto",
        limit: int | None = None,
        progress: Update | None = None,
        stop_at_layer: int | None = None,
    ) -> TraceResult:
        """Stream ``data`` through the model, feeding each reducer its site; keep only statistics.

        ``data``: an image tensor ``[N, 3, H, W]`` (split into ``batch_size`` batches), a
        DataLoader, or any iterable of batches. ``progress(n)`` is called with the number of
        images done after each batch. Memory stays bounded by the reducers' own state.
        ``stop_at_layer=k`` runs blocks ``0..k-1`` of every batch only (see :meth:`features`);
        reducers of later sites are then fed nothing.

        Under torchrun (a process group of several ranks) every rank must call this with the
        same data and reducers: each forwards its part of every batch
        (:func:`vitreg.distributed.shard`) -- or, for a source that splits itself by rank
        (webdataset shards, :func:`vitreg.distributed.split`), its own images -- then the
        reducers are merged across ranks, so every rank returns the single-process result
        (per-image rows in global image order).
        Inside ``vitreg.distributed.local()`` each rank traces all the data by itself.
        """
        by_site: dict[str, list[Reducer]] = {}
        for r in reducers:
            for name in r.sites:
                self.site(name)  # one exact, known name
                by_site.setdefault(name, []).append(r)
        offset = 0
        layouts: dict[str, TokenLayout | None] = {}
        sources: dict[str, str] = {}

        def feed(name: str) -> HookFn:
            def fn(t: torch.Tensor, hook: HookContext) -> None:
                layouts[name] = hook.layout
                if hook.attn_source is not None:
                    sources[name] = hook.attn_source
                for r in by_site[name]:
                    r(t, hook, offset)

            mine = by_site[name]
            columns = any(r.reads_pattern_columns for r in mine)
            return mark_streamed(fn, all(r.streams_patterns for r in mine), columns)

        k = None if stop_at_layer is None else self.stop_index(stop_at_layer)
        feeds = self._until([(n, feed(n)) for n in by_site], k)
        stream = distributed.split(data, limit) or distributed.shard(
            iter_batches(data, batch_size, limit)
        )
        ckpt, skip, finished = resume_trace(
            reducers, batch_size, limit, attention, k, layouts, sources, stream.independent
        )

        def state() -> TraceState:
            return trace_state(reducers, layouts, sources)

        with torch.no_grad(), self.hooks(feeds, attention):
            for batch in stream:
                if stream.seen <= skip:  # covered by the checkpoint this pass resumed from
                    continue
                offset = stream.offset  # global index of this part's first image
                self.features(batch, stop_at_layer=k)
                if ckpt is not None:
                    ckpt.step(stream.seen, state)
                if progress is not None:
                    progress(stream.seen)
        if progress is not None and stream.independent:  # this rank's last part may end early
            progress(stream.seen)  # the image count of all ranks
        if ckpt is not None and not finished:
            ckpt.save(stream.seen, state(), done=True)
        if stream.world > 1:  # every rank gets the statistics of all images
            distributed.merge_reducers(reducers)
            layouts = distributed.merge_dicts(layouts)
            sources = distributed.merge_dicts(sources)
        return TraceResult(list(reducers), stream.seen, layouts, sources)

    def run_batches(
        self,
        data: Any,
        batch_size: int = 32,
        limit: int | None = None,
        progress: Update | None = None,
        stop_at_layer: int | None = None,
    ) -> int:
        """``features`` over every batch of ``data`` (no grad) for the hooks attached; returns
        the number of images seen. ``stop_at_layer``: as in :meth:`features`."""
        k = None if stop_at_layer is None else self.stop_index(stop_at_layer)
        done = 0
        with torch.no_grad():
            for batch in iter_batches(data, batch_size, limit):
                self.features(batch, stop_at_layer=k)
                done += batch.shape[0]
                if progress is not None:
                    progress(done)
        return done

    # token insertion --------------------------------------------------------------------
    def insert_tokens(self, values: torch.Tensor | int) -> Handle:
        """Insert tokens right after [CLS] and trained registers, where trained registers enter:
        before the pre-norm (CLIP's ``ln_pre``/timm ``norm_pre``) when the model has one, so a
        zero token reaches block 0 as ``norm_pre(0)``; else before block 0.

        ``values``: an int k (k zero tokens), a ``[k, C]`` tensor shared by every image, or a
        ``[B, k, C]`` tensor. The source's bookkeeping (``num_prefix_tokens`` and its kin) is
        updated so pooling, heads and ``forward_intermediates`` ignore the tokens, and
        :meth:`features` strips them. Remove with the returned handle (or use it in ``with``).
        """
        if self._insertion is not None:
            raise HookError("tokens are already inserted in this model; remove that handle first")
        if isinstance(values, int):
            if values < 1:
                raise InputError(f"insert at least one token, got {values}")
            values = torch.zeros(values, self.d_model)
        if values.dim() == 2:
            values = values.unsqueeze(0)
        if values.dim() != 3 or values.shape[-1] != self.d_model:
            raise InputError(
                f"inserted token values must be [k, {self.d_model}] or [B, k, {self.d_model}], "
                f"got {tuple(values.shape)}"
            )
        k = values.shape[1]

        def values_fn(batch: int, like: torch.Tensor) -> torch.Tensor:
            v = values.to(device=like.device, dtype=like.dtype)
            if v.shape[0] == 1:
                return v.expand(batch, -1, -1)
            if v.shape[0] != batch:
                raise InputError(f"inserted values are for batch {v.shape[0]}, input has {batch}")
            return v

        inner = self.adapter.insert_tokens(k, values_fn)
        self._n_extra = k

        def undo() -> None:
            inner.remove()
            self._n_extra = 0
            self._insertion = None

        self._insertion = Handle([undo])
        return self._insertion
