"""The per-kind result blocks are typed: a ``vitreg diagnose`` run with every kind on returns
the models of ``vitreg.results.kinds``, which survive a round trip through their JSON, and the
exported JSON Schema names every field those analyses write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import vitreg
from vitreg.analysis.anomaly_lof import LOFAnalysis
from vitreg.analysis.base import run_analyses, summary_of
from vitreg.analysis.diagnose import diagnose
from vitreg.analysis.massive import MassiveAnalysis
from vitreg.analysis.registers import RegisterAnalysis
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.cli.app import app
from vitreg.errors import InputError
from vitreg.results import kinds as typed
from vitreg.results.diagnose import DiagnoseResults
from vitreg.results.schema import json_schema, plain, validate_metrics
from vitreg.testing.planted import build_kind

BLOCKS = {
    "kinds": typed.Kinds,
    "sinks": typed.Sinks,
    "massive": typed.Massive,
    "lof": typed.LOF,
    "positions": typed.Positions,
    "registers": typed.Registers,
}


def added_only(written: Any, dumped: Any, path: str = "") -> list[str]:
    """Where ``dumped`` differs from ``written`` other than by an added 0 or None."""
    if isinstance(written, dict) and isinstance(dumped, dict):
        out = [f"{path}.{k}: dropped" for k in written if k not in dumped]
        out += [f"{path}.{k}: added {dumped[k]!r}" for k in dumped if k not in written]
        out = [o for o in out if not o.endswith(("added 0.0", "added None"))]
        return out + [
            d for k in written if k in dumped for d in added_only(written[k], dumped[k], path + k)
        ]
    if isinstance(written, list) and isinstance(dumped, list) and len(written) == len(dumped):
        return [
            d
            for i, (a, b) in enumerate(zip(written, dumped, strict=True))
            for d in added_only(a, b, f"{path}[{i}]")
        ]
    same = written == dumped or (written != written and dumped != dumped)  # NaN
    return [] if same and type(written) is type(dumped) else [f"{path}: {written!r} {dumped!r}"]


@pytest.mark.parametrize("name", ["kinds_registers", "kinds_position", "kinds_massive"])
def test_kinds_blocks_validate_typed_with_their_content(name: str) -> None:
    model = vitreg.wrap(build_kind(name)[0])
    x = torch.randn(5, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    results = diagnose(model, x, batch_size=3).results
    for key, model_type in BLOCKS.items():
        assert isinstance(getattr(results, key), model_type), key
    written = plain(results.model_dump())
    parsed = DiagnoseResults.model_validate(written)
    assert parsed == results
    dumped = parsed.model_dump(mode="json")
    for key in BLOCKS:
        assert added_only(written[key], dumped[key], key) == []
    by_kind = {k.kind: k.evidence for k in parsed.kinds.kinds}
    assert isinstance(by_kind["NOP sinks"], typed.SinkEvidence)
    assert isinstance(by_kind["registers absorbed the artifacts"], typed.RegisterEvidence)
    assert isinstance(by_kind["high-norm outliers"], typed.HighNormEvidence)
    assert isinstance(by_kind["attention artifacts"], typed.AttentionEvidence)


def test_without_norms_the_lof_agreement_and_missing_kinds_validate() -> None:
    model = vitreg.wrap(build_kind("kinds_nop_sink")[0])
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    chosen = [SinkAnalysis(), MassiveAnalysis(), LOFAnalysis()]  # positions need the norms
    with pytest.raises(InputError, match="NormAnalysis"):  # the verdict reads the norms
        diagnose(model, x, analyses=[*chosen, RegisterAnalysis()], batch_size=2)
    found, _, _ = run_analyses(model, x, [*chosen, RegisterAnalysis()], batch_size=2)
    written = plain({name: summary_of(r).model_dump() for name, r in found.items()})
    assert found["lof"].agreement_with_auto == typed.LOFAgreement()
    assert set(written["lof"]["agreement_with_auto"].values()) == {None}
    with pytest.raises(Exception, match="norms"):  # the norms block stays required
        DiagnoseResults.model_validate(written)
    written["norms"] = plain(diagnose(model, x, batch_size=2).results.norms.model_dump())
    parsed = DiagnoseResults.model_validate(written)
    assert parsed.lof.agreement_with_auto == typed.LOFAgreement()
    assert parsed.kinds is None  # the per-kind verdict is built by diagnose, with the norms
    bad = json.loads(json.dumps(written))
    bad["sinks"]["heads"][0]["kind"] = "sideways"
    with pytest.raises(Exception, match="kind"):
        DiagnoseResults.model_validate(bad)


def test_the_schema_lists_every_kinds_field(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cli = CliRunner().invoke(
        app, ["diagnose", "planted:kinds_registers", "--limit", "4", "--out", str(out)]
    )
    assert cli.exit_code == 0, cli.output
    doc = json.loads((out / "metrics.json").read_text())
    validate_metrics(doc)
    defs = json_schema()["$defs"]
    results = defs["DiagnoseResults"]["properties"]
    for key, model_type in BLOCKS.items():
        assert f'"#/$defs/{model_type.__name__}"' in json.dumps(results[key]), key
        assert set(defs[model_type.__name__]["properties"]) >= set(doc["results"][key]), key
        assert "JsonValue" not in json.dumps(defs[model_type.__name__]), key
    head = doc["results"]["sinks"]["heads"][0]
    assert set(defs["SinkHeadRow"]["properties"]) == set(head)
    block = doc["results"]["registers"]["blocks"][0]
    assert set(defs["RegisterBlock"]["properties"]) >= set(block)
    for verdict in doc["results"]["kinds"]["kinds"]:
        refs = json.dumps(defs["KindRow"]["properties"]["evidence"])
        assert (
            any(
                set(defs[name]["properties"]) == set(verdict["evidence"])
                for name in defs
                if f'"#/$defs/{name}"' in refs and "properties" in defs[name]
            )
            or verdict["evidence"] == {}
        ), verdict["kind"]
