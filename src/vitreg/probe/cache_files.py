"""The files of a feature cache, typed: the identity hashed into its folder name and written
first in ``manifest.json``, and the manifest itself (read back by :class:`CachedFeatures`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    model_serializer,
    model_validator,
)

from vitreg.errors import VitregError
from vitreg.results.base import ReadByKey
from vitreg.results.schema import ModelDescription


class FixIdentity(BaseModel):
    """A fix as the cache key names it: its class, what its ``describe()`` says (the name
    aside) and, if it has them, its exact neurons; written flat, in that order."""

    class_name: str
    said: dict[str, JsonValue]
    neurons: list[list[int]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: JsonValue) -> JsonValue:
        """A manifest's flat fix block (``class``, the settings, ``neurons``) read back."""
        if not isinstance(data, dict) or "class" not in data:
            return data
        said = {k: v for k, v in data.items() if k != "class"}
        neurons = said.pop("neurons") if isinstance(said.get("neurons"), list) else None
        return {"class_name": data["class"], "said": said, "neurons": neurons}

    @model_serializer
    def _flat(self) -> dict[str, JsonValue]:
        flat: dict[str, JsonValue] = {"class": self.class_name, **self.said}
        if self.neurons is not None:
            flat["neurons"] = list(self.neurons)
        return flat


class CacheIdentity(BaseModel):
    """Everything the cached tensors depend on: hashed into the folder name
    (:func:`cache_key`) and written first in the manifest, in this order."""

    model_config = ConfigDict(extra="forbid")

    format: int
    model: ModelDescription
    weights: str
    fix: FixIdentity | None
    dataset: dict[str, JsonValue]
    targets: list[str]
    layers: list[str]
    views: list[str]
    dtype: str
    pixels: bool
    input: dict[str, int | list[float]]
    shard_size: int

    def written(self) -> dict[str, JsonValue]:
        """The identity as the key hashes it and the manifest writes it."""
        return self.model_dump(by_alias=True)


class SkippedSample(BaseModel):
    """A sample a shard left out: its index, key and why."""

    index: int
    key: str
    reason: str


class ShardEntry(BaseModel):
    """One shard as the manifest lists it: file, sample span, samples kept and skipped, hash."""

    file: str
    start: int
    stop: int
    n: int
    skipped: list[SkippedSample]
    sha256: str | None = None  # absent in caches written before shards were hashed


class CacheManifest(CacheIdentity, ReadByKey):
    """``manifest.json`` of a cache folder: its identity, then the key, the layers asked
    for, the views a site cannot give, the layouts seen, sample counts and the shards."""

    key_read_warning: ClassVar[str] = (
        "CachedFeatures.manifest is a CacheManifest: read its fields (manifest.n); "
        "reading it by key goes in the next release"
    )

    key: str
    requests: list[int | str]
    absent: dict[str, dict[str, str]]
    layouts: dict[str, dict[str, int | list[int] | None]]
    n: int
    n_skipped: int
    skipped: dict[str, int]
    # absent in caches written before repairs and replacements were counted
    repairs: dict[str, int] = Field(default_factory=dict)
    replaced: dict[str, int] = Field(default_factory=dict)
    shards: list[ShardEntry]


def read_manifest(raw: JsonValue, where: str) -> CacheManifest:
    """``raw`` (a parsed ``manifest.json``) as a :class:`CacheManifest`, or a
    :class:`VitregError` naming the file and the first field that does not fit."""
    try:
        return CacheManifest.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(the top level)"
        raise VitregError(
            f"{where} is damaged ({field}: {first['msg']}); delete the cache folder to rebuild it"
        ) from None
