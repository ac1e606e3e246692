"""Reading metrics.json files of older schemas as 2.0: 1.0 (diagnose only, no ``verb``) and 1.1
(per-verb results; diagnose's attention sink mass as flat ``sink_mass_top{k}`` keys, fix's
per-block median patch norms beside its comparison). The upgrade is pure:
it returns a new document and never touches the file."""

from __future__ import annotations

import copy
from typing import Any

OLD_VERSIONS = ("1.0", "1.1")
SINK_PREFIX = "sink_mass_top"


def upgrade(doc: Any) -> Any:
    """``doc`` as a 2.0 document when it is a 1.0 or 1.1 one; anything else unchanged (the
    schema then says what is wrong with it)."""
    if not isinstance(doc, dict) or doc.get("schema_version") not in OLD_VERSIONS:
        return doc
    new = copy.deepcopy(doc)
    new["schema_version"] = "2.0"
    new.setdefault("verb", "diagnose")
    results = new.get("results")
    if new["verb"] == "fix" and isinstance(results, dict):
        _medians_into_comparison(results)
    if new["verb"] == "diagnose" and isinstance(results, dict):
        attention = results.get("attention")
        if isinstance(attention, dict):
            _nest_sink_mass(attention)
            if isinstance(attention.get("summary"), dict):
                _nest_sink_mass(attention["summary"])
    return new


def _medians_into_comparison(results: dict[str, Any]) -> None:
    """1.1 fix runs kept the per-block median patch norms beside ``comparison``; 2.0 inside."""
    comparison = results.get("comparison")
    for key in ("median_patch_norm_before", "median_patch_norm_after"):
        if key in results and isinstance(comparison, dict):
            comparison[key] = results.pop(key)


def _nest_sink_mass(block: dict[str, Any]) -> None:
    """``sink_mass_top1``, ``sink_mass_top5``... moved into ``sink_mass: {"1": .., "5": ..}``."""
    keys = [k for k in block if k.startswith(SINK_PREFIX)]
    block["sink_mass"] = {k.removeprefix(SINK_PREFIX): block.pop(k) for k in keys}
