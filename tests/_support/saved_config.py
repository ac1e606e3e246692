"""A verb's config given as what its config.yaml holds, for tests that call a writer directly."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import JsonValue


@dataclass(frozen=True)
class SavedConfig:
    """The writers' config: ``to_file()`` gives ``values``, written as config.yaml."""

    values: dict[str, JsonValue] = field(default_factory=dict)

    def to_file(self) -> dict[str, JsonValue]:
        return self.values
