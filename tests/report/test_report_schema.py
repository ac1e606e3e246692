"""Schema 2.0: typed results (no untyped field in the JSON Schema), a diagnose result whose
statistics are None renders, and a 1.1 run (tests/report/schema_1_1_diagnose.json, written by
vitreg before 2.0) still validates, compares and renders."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import TESTS
from vitreg.cli.app import app
from vitreg.report.render.html import render_html
from vitreg.report.render.markdown import render_markdown
from vitreg.report.renderers.diagnose import report as build_report
from vitreg.results.schema import VERBS, json_schema, resolve, validate_metrics
from vitreg.results.upgrade import upgrade
from vitreg.verbs.validate import check_run

TYPED = {"type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"}
OLD_RUN = TESTS / "report" / "schema_1_1_diagnose.json"
OLD_FIX = TESTS / "report" / "schema_1_1_fix.json"  # a fix run as schema 1.1 wrote it


def old_document() -> dict[str, Any]:
    return json.loads(OLD_RUN.read_text())


def retraced(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with each headline re-read from its results, as the writer does."""
    for m in doc["metrics"]:
        m["value"] = resolve(doc, m["source"], m["aggregate"])
    return doc


def rendered(doc: dict[str, Any]) -> str:
    """The Markdown of ``doc``'s report (its HTML rendered too), ``doc`` validated once."""
    report = build_report(validate_metrics(doc))
    assert "<html" in render_html(report, [], None)
    return render_markdown(report)


def untyped(node: dict[str, Any], where: str = "") -> list[str]:
    """Places in a JSON Schema that accept any value or any extra field."""
    found = [] if TYPED & node.keys() else [where or "/"]
    if node.get("additionalProperties") is True:
        found.append(f"{where}/additionalProperties")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            found += untyped(node[key], f"{where}/{key}")
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for i, sub in enumerate(node.get(key, [])):
            found += untyped(sub, f"{where}/{key}/{i}")
    for key, sub in node.get("properties", {}).items():
        found += untyped(sub, f"{where}/{key}")
    return found


def test_the_1_1_file_is_a_1_1_file_read_as_2_0() -> None:
    doc = old_document()
    assert doc["schema_version"] == "1.1" and "sink_mass_top1" in doc["results"]["attention"]
    valid = validate_metrics(doc)
    assert valid.schema_version == "2.0" and set(valid.results.attention.sink_mass) == {"1", "5"}
    assert doc == old_document(), "reading leaves the document it read untouched"
    assert upgrade({"schema_version": "9.9"}) == {"schema_version": "9.9"}


def test_a_1_1_fix_run_has_its_medians_read_into_the_comparison() -> None:
    from vitreg.verbs.report import renderer

    doc = json.loads(OLD_FIX.read_text())
    assert doc["schema_version"] == "1.1" and "median_patch_norm_before" in doc["results"]
    valid = validate_metrics(doc)
    c = valid.results.comparison
    assert c.median_patch_norm_before == doc["results"]["median_patch_norm_before"]
    assert len(c.median_patch_norm_after) == len(c.max_patch_norm_after)
    report = renderer("fix").report(valid, [])
    assert render_markdown(report).startswith("**SYNTHETIC")


def test_diagnose_results_where_statistics_are_none_render() -> None:
    """The crash of issue 19: no outlier patch (redundancy summaries None), blocks whose
    attention could not be matched to norms (agreement with a reason only), no final norm."""
    doc = upgrade(old_document())
    red = doc["results"]["redundancy"]
    for v in red["outlier_vs_normal"].values():
        v.update(outlier=None, auc=None)
    red.update(n_outliers=0, outlier_rate=0.0)
    red["border"].update(outlier_rate_border=None, border_over_interior=None)
    attn = doc["results"]["attention"]
    attn["agreement"] = [
        {"norm_site": a["norm_site"], "norm_method": None, "reason": "reduced grid"}
        for a in attn["agreement"]
    ]
    attn["entropy_normalized"] = [None] * len(attn["layers"])
    doc["results"]["norms"]["after_final_norm"] = None
    doc["metrics"] = [m for m in doc["metrics"] if "after_final_norm" not in m["name"]]
    doc["metrics"] = [m for m in doc["metrics"] if not m["name"].startswith("attention_norm")]
    doc = retraced(doc)
    validate_metrics(doc)
    md = rendered(doc)
    assert "| `embed_n4` | – |" in md and "No agreement at" in md and "reduced grid" in md
    assert "Not available: the model exposes no final-norm output" in md
    for block in ("attention", "redundancy", "ln_separation", "feature_pictures"):
        absent = copy.deepcopy(doc)
        absent["results"][block] = None
        absent["results"]["not_applicable"][block] = "not on this model"
        absent["metrics"] = [m for m in absent["metrics"] if f"/{block}/" not in m["source"]]
        assert "Not available: not on this model." in rendered(absent), block


def test_the_types_refuse_a_missing_or_mistyped_statistic() -> None:
    doc = upgrade(old_document())
    del doc["results"]["redundancy"]["border"]
    with pytest.raises(Exception, match="border"):
        validate_metrics(doc)
    doc = upgrade(old_document())
    doc["results"]["norms"]["layers"][0]["quantiles"]["p50"] = "big"
    with pytest.raises(Exception, match="p50"):
        validate_metrics(doc)


@pytest.mark.parametrize("verb", VERBS)
def test_the_results_schema_leaves_no_field_untyped(verb: str) -> None:
    """Every results field of every verb has a type: no open object, no field of any value,
    no JSON as read (a fix, a task's details, a data set: each a model)."""
    defs = json_schema()["$defs"]
    assert "JsonValue" not in defs
    seen, todo, gaps = set(), [f"{verb.capitalize()}Results"], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for field, sub in defs[name].get("properties", {}).items():
            gaps += [f"{name}.{field}{g}" for g in untyped(sub)]
        gaps += [name] if defs[name].get("additionalProperties", False) is not False else []
        text = json.dumps(defs[name])
        todo += [d for d in defs if f'"#/$defs/{d}"' in text]
    assert not gaps, gaps
    assert len(seen) > 1


def test_a_1_1_run_validates_renders_and_compares(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        run = tmp_path / name
        run.mkdir()
        shutil.copy(OLD_RUN, run / "metrics.json")
        (run / "config.yaml").write_text("verb: diagnose\n")
        # an old run has no manifest, so `vitreg report` leaves it alone: its pages, as that does
        report = build_report(validate_metrics(old_document()))
        (run / "report.md").write_text(render_markdown(report))
        (run / "report.html").write_text(render_html(report, [], None))
        runs.append(run)
    assert check_run(runs[0]).startswith("diagnose run, schema 1.1 (read as 2.0),")
    assert "**Emergence block:** none" in (runs[0] / "report.md").read_text()
    cli = CliRunner().invoke(app, ["compare", *map(str, runs), "--out", str(tmp_path / "cmp")])
    assert cli.exit_code == 0, cli.output
    assert "outlier_rate" in cli.output
    assert check_run(tmp_path / "cmp").startswith("compare output, 2 runs")


def test_vitreg_schema_exports_the_json_schema(tmp_path: Path) -> None:
    cli = CliRunner().invoke(app, ["schema"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output) == json_schema()
    cli = CliRunner().invoke(app, ["schema", "--out", str(tmp_path / "s.json")])
    assert cli.exit_code == 0 and json.loads((tmp_path / "s.json").read_text())["title"]
