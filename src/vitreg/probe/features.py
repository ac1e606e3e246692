"""CachedFeatures: the read side of a feature-cache folder (manifest + shards)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from vitreg.core.containment import check_inside
from vitreg.core.layout import TokenLayout
from vitreg.core.readers import read_json
from vitreg.errors import InputError, VitregError
from vitreg.probe.cache_files import CacheManifest, ShardEntry, read_manifest
from vitreg.probe.shards import MANIFEST, pixels_key, shard_meta
from vitreg.probe.views import NORMS, PATCH_VIEWS, TOP_INDEX

LAYOUT_FIELDS = ("n_cls", "n_reg", "grid", "patch_size", "n_extra")


class CachedFeatures:
    """Views per layer, targets, sample keys and layouts of one extraction.

    ``forward_passes`` is the number of batches the call that returned this object ran (0 when
    every shard was reused).
    """

    def __init__(self, folder: str | Path, forward_passes: int = 0) -> None:
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise InputError(f"{self.folder} has no {MANIFEST}; run probe.extract to (re)build it")
        check_inside(
            self.folder, path, "feature cache manifest"
        )  # containment: the manifest resolves inside the cache
        self.manifest: CacheManifest = read_manifest(
            read_json(path, "feature cache manifest"), f"feature cache manifest {path}"
        )
        self.forward_passes = forward_passes

    @property
    def n(self) -> int:
        return self.manifest.n

    @property
    def layers(self) -> list[str]:
        """Hook names of the cached layers, in the order asked."""
        return list(self.manifest.layers)

    @property
    def layout(self) -> dict[str, TokenLayout]:
        """Token layout at every cached layer (hook name -> layout)."""
        out = {}
        for name, d in self.manifest.layouts.items():
            kw = {k: tuple(d[k]) if isinstance(d[k], list) else d[k] for k in LAYOUT_FIELDS}
            out[name] = TokenLayout(**kw)
        return out

    @property
    def keys(self) -> list[str]:
        """Sample keys in row order (skipped samples left out)."""
        return [k for meta in self._metas() for k in json.loads(meta["keys"])]

    def layer_name(self, layer: int | str | None = None) -> str:
        """Hook name of ``layer``: a cached hook name, a value given to ``extract``, or None if
        only one layer is cached."""
        names, requests = self.layers, self.manifest.requests
        if layer is None and len(names) == 1:
            return names[0]
        if layer in names:
            return str(layer)
        if layer in requests:
            return names[requests.index(layer)]
        raise InputError(
            f"layer {layer!r} is not cached here; cached: {names} (asked as {requests})"
        )

    def get(self, view: str, layer: int | str | None = None) -> torch.Tensor:
        """``view`` at ``layer`` over all shards, float32 (``patch_top_index`` int64).

        Besides the views: ``"patch_norms"`` [n, N] (with any patch view), ``"patch_top_index"``
        [n] (with ``patch_top``) and ``"pixels"`` [n, N, p*p*3] at that layer's patch size
        (with ``pixels=True``).
        """
        name = self.layer_name(layer)
        if view == "pixels":
            if not self.manifest.pixels:
                raise InputError("pixels were not extracted; rerun extract with pixels=True")
            return self._cat(pixels_key(self.layout[name]))
        reason = self.manifest.absent.get(name, {}).get(view)
        if reason is not None:
            raise InputError(f"view {view!r} is absent at {name!r}: {reason}")
        wanted = list(self.manifest.views)
        wanted += [NORMS] if any(v in PATCH_VIEWS for v in wanted) else []
        wanted += [TOP_INDEX] if "patch_top" in wanted else []
        if view not in wanted:
            raise InputError(f"view {view!r} was not extracted; extracted: {wanted}")
        return self._cat(f"{name}/{view}")

    def targets(self, name: str) -> torch.Tensor | list[torch.Tensor]:
        """Target ``name``: label [n] / mask [n, S, S] int64, depth [n, S, S] float32 (NaN =
        invalid), boxes a list of [K, 4] xyxy tensors in input pixels."""
        if name not in self.manifest.targets:
            raise InputError(f"no target {name!r}; this dataset has {self.manifest.targets}")
        if name == "boxes":
            boxes = [b for meta in self._metas() for b in json.loads(meta["boxes"])]
            return [torch.tensor(b, dtype=torch.float32).reshape(-1, 4) for b in boxes]
        t = self._cat(f"target/{name}")
        return t if name == "depth" else t.long()

    def _shard(self, shard: ShardEntry) -> Path:
        """The file of a manifest entry, refused unless it resolves inside the cache folder."""
        return check_inside(self.folder, self.folder / shard.file, "feature cache shard")

    def _metas(self) -> list[dict[str, str]]:
        out = []
        for shard in self.manifest.shards:
            meta = shard_meta(self._shard(shard))
            if meta is None or meta.get("key") != self.manifest.key:
                raise VitregError(f"{shard.file} in {self.folder} is missing or damaged")
            out.append(meta)
        return out

    def _cat(self, tensor: str) -> torch.Tensor:
        parts = []
        for shard in self.manifest.shards:
            if shard.n:
                path = self._shard(shard)
                try:
                    with safe_open(str(path), framework="pt") as f:
                        parts.append(f.get_tensor(tensor))
                except Exception as e:  # a shard made by hand may lack any tensor
                    raise self._damaged(f"{path.name} cannot give {tensor!r} ({e})") from None
        if not parts:
            raise InputError(f"{self.folder} holds no samples (all were skipped)")
        try:
            t = torch.cat(parts)
        except RuntimeError as e:
            raise self._damaged(f"the shards' {tensor!r} do not fit together ({e})") from None
        return t.float() if t.is_floating_point() else t

    def _damaged(self, what: str) -> VitregError:
        """The error of a cache whose shards are not what vitreg wrote."""
        return VitregError(
            f"the feature cache {self.folder} is damaged or was not written by vitreg: {what}; "
            "delete that folder and vitreg extracts the features again"
        )

    def __repr__(self) -> str:
        views = self.manifest.views
        return f"CachedFeatures({self.n} samples, layers={self.layers}, views={views})"
