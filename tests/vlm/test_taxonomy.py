"""EmbedLens's sink / dead / alive split: the rule on hand-made vectors, the sites against the
language model's own hidden states, and a tiny LLaVA with planted sinks (the planted tower's
high-norm tokens) and planted dead tokens (zero tower features)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import vitreg
from vitreg import NeuronSet, TestTimeRegisters
from vitreg.cli.app import app
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.results.schema import validate_metrics
from vitreg.results.vlm import TaxonomyAnchors
from vitreg.testing.images import synthetic_pil
from vitreg.testing.planted import save_tiny_llava
from vitreg.vlm import prompt_text, read, run_vlm, token_ids
from vitreg.vlm.taxonomy import (
    ALIVE,
    DEAD,
    SINK,
    SiteTokens,
    check_k,
    check_sites,
    classify,
    find_anchors,
    found_dead,
    nearest_ids,
    split,
    total,
)

pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = 64  # 4 x 4 image tokens
PROMPT = "What is in the image?"
DEAD_TOKENS = [5, 10]  # image tokens whose tower feature is planted to zero


def anchors(sinks: list[int], dead: list[int]) -> TaxonomyAnchors:
    return TaxonomyAnchors(
        sink_ids=sinks,
        dead_ids=dead,
        sink_tokens=[],
        dead_tokens=[],
        sink_source="given",
        dead_source="given",
    )


def test_nearest_ids_are_by_cosine_not_by_dot_product() -> None:
    table = torch.tensor([[10.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    hidden = torch.tensor([[0.5, 0.7], [1.0, 0.01]])
    assert nearest_ids(hidden, table, 1).tolist() == [[1], [0]]  # a dot product picks row 0
    assert set(nearest_ids(hidden, table, 2)[0].tolist()) == {1, 2}


def test_sink_comes_before_dead_and_the_rest_is_alive() -> None:
    nearest = torch.tensor([[4, 7, 1], [7, 2, 3], [2, 3, 9], [9, 8, 0], [4, 5, 6]])
    norms = torch.tensor([1.0, 2.0, 3.0, 1.0, 0.0])  # the last: the zero vector, dead
    codes = classify(SiteTokens(nearest[:4], norms[:4]), anchors([4], [7, 0]))
    assert codes.tolist() == [SINK, DEAD, ALIVE, DEAD]
    assert classify(SiteTokens(nearest, norms), anchors([4], [])).tolist()[::4] == [SINK, DEAD]
    assert classify(SiteTokens(nearest[:1], torch.zeros(1)), anchors([4], [])).tolist() == [DEAD]
    part = split(2, codes)
    assert (part.site, part.sink, part.dead, part.alive, part.n_tokens) == ("layer 2", 1, 2, 1, 4)
    assert part.alive_share == 0.25
    both = total([[split(0, codes)], [split(0, torch.tensor([ALIVE, ALIVE]))]])
    assert both[0].site == "input" and both[0].alive == 3 and both[0].alive_share == 0.5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, vitreg.Model, NeuronSet]:
    """The saved tiny LLaVA folder, its tower loaded through hf-vlm:, the planted neurons."""
    folder = save_tiny_llava(tmp_path_factory.mktemp("llava") / "tiny", img_size=SIZE)
    with pytest.warns(UserWarning, match="synthetic"):
        model = vitreg.load(f"hf-vlm:{folder}")
    truth = json.loads((folder / "vitreg_planted.json").read_text())["ground_truth"]
    return folder, model, NeuronSet.from_pairs([tuple(u) for u in truth["units"]], model)


@pytest.fixture(scope="module")
def pixels(tiny) -> torch.Tensor:
    """Three synthetic images with flat regions (where the planted tower writes outliers)."""
    return tiny[1].preprocess(synthetic_pil(3, SIZE, 0, 0.3))


@contextmanager
def dead_features(model: vitreg.Model, tokens: list[int]) -> Iterator[None]:
    """Zero the tower features of image ``tokens`` where they enter the projector (an image's
    features; the one-feature probe of the dead anchor passes untouched)."""

    def zero(_m: torch.nn.Module, args: tuple) -> tuple:
        x = args[0].clone()
        if x.shape[1] > max(tokens):
            x[:, tokens] = 0
        return (x, *args[1:])

    handle = model.vlm.projector.register_forward_pre_hook(zero)
    try:
        yield
    finally:
        handle.remove()


def test_sites_are_the_language_models_hidden_states(tiny, pixels) -> None:
    """Site 0 is the input embeddings, site k the output of decoder layer k (hidden_states[k])."""
    _, model, _ = tiny
    vlm = model.vlm
    ids = token_ids(model, vlm, prompt_text(vlm, PROMPT), (SIZE, SIZE))
    pv = pixels[:1]
    reading = read(model, ids, pv, [ids.shape[1] - 1], [ids.shape[1] - 1], sites=[0, 1], k=3)
    with torch.no_grad():
        out = vlm.module(input_ids=ids, pixel_values=pv, output_hidden_states=True)
    image = ids[0] == vlm.image_token_id
    table = vlm.module.get_input_embeddings().weight
    for site in (0, 1):
        hidden = out.hidden_states[site][0, image]
        assert torch.equal(reading.sites[site].nearest, nearest_ids(hidden, table, 3))
        assert torch.allclose(reading.sites[site].norms, hidden.norm(dim=-1))


def test_planted_sinks_and_dead_tokens_are_found(tiny, pixels) -> None:
    _, model, neurons = tiny
    with dead_features(model, DEAD_TOKENS):
        result = run_vlm(
            model, pixels, PROMPT, TestTimeRegisters(neurons), max_new_tokens=2, llm_layers=[1, 2]
        )
    tax = result.results.taxonomy
    assert tax is not None and tax.k == 3
    # the tiny LLaVA's projector has zero biases: a zero feature stays the zero vector
    assert tax.anchors.dead_ids == found_dead(model.vlm) == [] and not tax.anchors.dead_tokens
    assert tax.anchors.dead_source.startswith("found: none")
    assert tax.anchors.sink_ids and tax.anchors.sink_source.startswith("found")
    assert [p.site for p in tax.before] == ["input", "layer 1", "layer 2"]
    n = 16 * len(pixels)
    assert all(p.n_tokens == n == p.sink + p.dead + p.alive for p in tax.before + tax.after)
    planted = 0
    for image in result.images:
        high = (
            image.before.reading.norm_grid.flatten() > 10 * image.before.reading.norm_grid.median()
        )
        before = classify(image.before.reading.sites[0], tax.anchors)
        after = classify(image.after.reading.sites[0], tax.anchors)
        assert before[DEAD_TOKENS].tolist() == after[DEAD_TOKENS].tolist() == [DEAD, DEAD]
        assert (before[high] == SINK).all()  # the tower's planted high-norm tokens
        planted += int(high.sum())
        assert image.results.taxonomy is not None
    assert planted >= 2
    assert tax.before[0].dead >= len(DEAD_TOKENS) * len(pixels)
    assert tax.after[0].sink < tax.before[0].sink  # the fix takes the sinks' norm away


def test_given_anchors_are_used_as_given(tiny, pixels) -> None:
    _, model, neurons = tiny
    result = run_vlm(
        model, pixels[:1], PROMPT, TestTimeRegisters(neurons), 1, taxonomy_k=1,
        sink_tokens=[7], dead_tokens=[8, 9],
    )  # fmt: skip
    tax = result.results.taxonomy
    assert tax is not None and tax.k == 1 and len(tax.before) == 1
    assert (tax.anchors.sink_ids, tax.anchors.dead_ids) == ([7], [8, 9])
    assert tax.anchors.sink_source == tax.anchors.dead_source == "given"
    words = model.vlm.tokenizer.convert_ids_to_tokens
    assert tax.anchors.dead_tokens == [words(8), words(9)]
    nearest = result.images[0].before.reading.sites[0].nearest[:, 0]
    assert tax.before[0].sink == int((nearest == 7).sum())
    assert tax.before[0].dead == int(((nearest == 8) | (nearest == 9)).sum())


def test_bad_input_ends_in_a_named_error(tiny, pixels, monkeypatch) -> None:
    _, model, neurons = tiny
    vlm = model.vlm
    with pytest.raises(InputError, match=r"outside 1\.\.2"):
        check_sites(vlm, [3])
    with pytest.raises(InputError, match=r"outside 1\.\.2"):
        run_vlm(model, pixels[:1], PROMPT, TestTimeRegisters(neurons), 1, llm_layers=[0])
    assert check_sites(vlm, [2, 1, 2]) == [0, 1, 2]
    vocab = vlm.module.get_input_embeddings().weight.shape[0]
    with pytest.raises(InputError, match="taxonomy-k"):
        check_k(vlm, vocab + 1)
    with pytest.raises(InputError, match="sink-tokens"):
        find_anchors(vlm, [], [vocab], None)
    with pytest.raises(InputError, match="dead-tokens"):
        find_anchors(vlm, [], [1], [-1])
    monkeypatch.setattr(vlm.module, "get_input_embeddings", lambda: None)
    with pytest.raises(UnsupportedModelError, match="input-embedding"):
        check_k(vlm, 3)


def test_a_vlm_without_a_projector_needs_dead_tokens(tiny, monkeypatch) -> None:
    _, model, _ = tiny
    inner = model.vlm.module.model
    monkeypatch.delattr(inner, "multi_modal_projector")
    with pytest.raises(UnsupportedModelError, match="multi_modal_projector"):
        found_dead(model.vlm)
    assert find_anchors(model.vlm, [], [1], [2]).dead_ids == [2]


def test_cli_vlm_reports_the_split(tiny, tmp_path: Path) -> None:
    folder, model, neurons = tiny
    out = tmp_path / "run"
    args = ["vlm", f"hf-vlm:{folder}", "--prompt", PROMPT, "--limit", "2"]
    args += ["--neurons", str(neurons.save(tmp_path / "neurons")), "--max-new-tokens", "2"]
    args += ["--llm-layers", "1,2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "input: sink / dead / alive" in result.output and "layer 2:" in result.output
    doc = validate_metrics(json.loads((out / "metrics.json").read_text()))
    tax = doc.results.taxonomy
    assert [p.layer for p in tax.after] == [0, 1, 2]
    metrics = {m.name: m.value for m in doc.metrics}
    assert metrics["vlm.alive_share_input_before"] == tax.before[0].alive_share
    assert metrics["vlm.sink_input_after"] == tax.after[0].sink
    report = (out / "report.md").read_text()
    assert "Sink / dead / alive image tokens" in report and "arXiv 2603.00510" in report
    assert "figures/vlm_taxonomy.png" in report
    assert (out / "figures" / "vlm_taxonomy.png").is_file()
    bad = CliRunner().invoke(app, [*args[:-2], "--taxonomy-k", "0", "--out", str(tmp_path / "b")])
    assert bad.exit_code != 0 and "taxonomy" in bad.output


def test_with_projector_biases_the_dead_anchor_is_the_projected_zero_feature(
    tiny, pixels, monkeypatch
) -> None:
    _, model, neurons = tiny
    projector = model.vlm.projector
    torch.manual_seed(1)
    monkeypatch.setattr(projector.linear_2, "bias", torch.nn.Parameter(torch.randn(32)))
    table = model.vlm.module.get_input_embeddings().weight
    with torch.no_grad():
        nulls = projector(torch.zeros(1, 1, projector.linear_1.in_features))[0]
    assert found_dead(model.vlm) == nearest_ids(nulls, table, 1)[0].tolist()
    with dead_features(model, DEAD_TOKENS):
        result = run_vlm(model, pixels[:1], PROMPT, TestTimeRegisters(neurons), 1)
    tax = result.results.taxonomy
    assert tax is not None and tax.anchors.dead_source.startswith("found: the nearest")
    tokens = result.images[0].before.reading.sites[0]
    assert (tokens.norms[DEAD_TOKENS] > 0).all()  # dead by the anchor, not as zero vectors
    assert classify(tokens, tax.anchors)[DEAD_TOKENS].tolist() == [DEAD, DEAD]
