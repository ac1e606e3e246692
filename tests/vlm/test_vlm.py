"""Test-time registers inside a VLM: a tiny LLaVA built offline (the planted HF CLIP tower
``hf_clip_t16``, a random projector and 2-layer Llama, a word-level tokenizer), saved with
save_pretrained and loaded as ``hf-vlm:DIR``. No download anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import vitreg
from vitreg import NeuronSet, TestTimeRegisters
from vitreg.cli.app import app
from vitreg.configs import VlmConfig, load_config
from vitreg.errors import InputError, SpecError
from vitreg.results.schema import validate_metrics
from vitreg.results.vlm import AnswerChange, FirstTokenChange
from vitreg.results.vlm import Condition as ConditionResults
from vitreg.testing import build
from vitreg.testing.images import synthetic_pil
from vitreg.testing.planted import save_tiny_llava
from vitreg.vlm import (
    answer_change,
    condition,
    edit_distance,
    feature_site,
    first_token_change,
    prompt_text,
    read,
    to_grid,
    token_ids,
    wrap_vlm,
)

pytestmark = pytest.mark.usefixtures("one_thread")
SIZE = 112
PROMPT = "What is in the image?"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, vitreg.Model, NeuronSet]:
    """The saved tiny LLaVA folder, its tower loaded through hf-vlm:, the planted neurons."""
    folder = save_tiny_llava(tmp_path_factory.mktemp("llava") / "tiny", img_size=SIZE)
    with pytest.warns(UserWarning, match="synthetic"):
        model = vitreg.load(f"hf-vlm:{folder}")
    truth = json.loads((folder / "vitreg_planted.json").read_text())["ground_truth"]
    units = [tuple(u) for u in truth["units"]]
    neurons = NeuronSet.from_pairs(units, model)
    return folder, model, neurons


@pytest.fixture(scope="module")
def pixels(tiny) -> torch.Tensor:
    """Two synthetic images with flat regions (the planted outliers), through the processor."""
    _, model, _ = tiny
    return model.preprocess(synthetic_pil(2, SIZE, 0, 0.3))


def inputs(model: vitreg.Model, pv: torch.Tensor) -> torch.Tensor:
    return token_ids(model, model.vlm, prompt_text(model.vlm, PROMPT), tuple(pv.shape[-2:]))


def vlm_logits(model: vitreg.Model, ids: torch.Tensor, pv: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.vlm.module(input_ids=ids, pixel_values=pv).logits


def test_planted_hf_clip_equals_its_timm_twin() -> None:
    timm_tower, truth = build("clip_t16", img_size=SIZE)
    hf_tower, hf_truth = build("hf_clip_t16", img_size=SIZE)
    assert hf_truth.units == truth.units and type(hf_tower).__name__ == "CLIPVisionModel"
    x = truth.normalize(torch.rand(2, 3, SIZE, SIZE))
    a, b = vitreg.wrap(timm_tower), vitreg.wrap(hf_tower)
    site = "blocks.8.hook_resid_post"
    _, ca = a.run_with_cache(x, names=site)
    _, cb = b.run_with_cache(x, names=site)
    assert torch.allclose(ca[site], cb[site], atol=1e-3, rtol=1e-4)


def test_load_exposes_the_tower_and_keeps_the_vlm(tiny) -> None:
    _, model, _ = tiny
    from transformers import LlavaForConditionalGeneration

    assert isinstance(model.vlm.module, LlavaForConditionalGeneration)
    assert model.module is model.vlm.module.model.vision_tower
    assert model.family == "hf-clip" and model.layout.n_patches == (SIZE // 16) ** 2
    assert "blocks.6.mlp.hook_post" in model.hook_names()
    assert feature_site(model, model.vlm) == f"blocks.{model.n_layers - 2}.hook_resid_post"
    assert any("synthetic" in n for n in model.notes)


def test_empty_neuron_set_leaves_the_logits_unchanged(tiny, pixels) -> None:
    _, model, neurons = tiny
    pv = pixels[:1]
    ids = inputs(model, pv)
    bare = vlm_logits(model, ids, pv)
    empty = NeuronSet([], [], [], n_layers=model.n_layers, d_mlp=model.d_mlp)
    with TestTimeRegisters(empty).applied(model):
        same = vlm_logits(model, ids, pv)
    with TestTimeRegisters(neurons).applied(model):
        fixed = vlm_logits(model, ids, pv)
    assert torch.equal(bare, same)
    assert not torch.allclose(bare, fixed)  # the planted fix does change what the LM sees


def test_fixed_vlm_feeds_the_projector_vitregs_fixed_tower_output(tiny, pixels) -> None:
    _, model, neurons = tiny
    pv = pixels[1:]
    ids = inputs(model, pv)
    site = feature_site(model, model.vlm)
    seen: list[torch.Tensor] = []
    projector = model.vlm.module.model.multi_modal_projector
    handle = projector.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
    ttr = TestTimeRegisters(neurons)
    try:
        vlm_logits(model, ids, pv)
        with ttr.applied(model):
            vlm_logits(model, ids, pv)
            _, cache = model.run_with_cache(pv, names=site)
    finally:
        handle.remove()
    before, after = seen
    assert before.shape == after.shape == (1, model.layout.n_patches, model.d_model)
    assert cache.layout(site).n_extra == 1  # vitreg's own view holds the register
    expected = cache.patches(site).flatten(1, 2)
    assert torch.allclose(after, expected, atol=1e-5, rtol=1e-5)
    norms_before, norms_after = before.norm(dim=-1), after.norm(dim=-1)
    ratio = lambda n: float(n.max() / n.median())  # noqa: E731
    assert ratio(norms_before) > 10 > 2 > ratio(norms_after)


def hand_rows(model, seq, pv, positions) -> torch.Tensor:
    """``[L, H, Q, n_img]`` from transformers' own ``output_attentions``."""
    with torch.no_grad():
        out = model.vlm.module(input_ids=seq, pixel_values=pv, output_attentions=True)
    image = (seq[0] == model.vlm.image_token_id).nonzero()[:, 0]
    return torch.stack([a[0][:, positions][:, :, image] for a in out.attentions]).float()


def test_attention_mass_equals_the_hand_computation(tiny, pixels) -> None:
    _, model, neurons = tiny
    pv = pixels[:1]
    ids = inputs(model, pv)
    positions = [ids.shape[1] - 1, 2]
    for ttr in (None, TestTimeRegisters(neurons)):
        if ttr is None:
            reading = read(model, ids, pv, positions, [ids.shape[1] - 1])
            expected = hand_rows(model, ids, pv, positions)
        else:
            with ttr.applied(model):
                reading = read(model, ids, pv, positions, [ids.shape[1] - 1])
                expected = hand_rows(model, ids, pv, positions)
        att = reading.attention
        assert att.rows.shape == expected.shape
        assert torch.allclose(att.rows, expected, atol=1e-6)
        assert torch.allclose(att.mass, expected.sum(-1), atol=1e-6)
        assert 0 < float(att.mass.min()) and float(att.mass.max()) <= 1 + 1e-6
        # the map sums to the mean mass over layers, heads and rows
        assert float(att.mean_map().sum()) == pytest.approx(float(expected.sum(-1).mean()), 1e-5)


def test_answer_map_is_read_at_the_positions_asked(tiny, pixels) -> None:
    _, model, _ = tiny
    pv = pixels[1:]
    ids = inputs(model, pv)
    n_prompt = ids.shape[1]
    c = condition(model, ids, pv, query="answer", max_new_tokens=4)
    assert isinstance(c.results, ConditionResults) and c.results.n_generated == len(
        c.results.answer_tokens
    )
    n = len(c.results.answer_tokens)
    assert 1 <= n <= 4
    assert c.reading.attention.positions == list(range(n_prompt - 1, n_prompt - 1 + n))
    seq = torch.cat([ids[0], torch.tensor(c.results.answer_tokens)])[None]
    expected = hand_rows(model, seq, pv, c.reading.attention.positions)
    assert torch.allclose(c.reading.attention.rows, expected, atol=1e-6)
    assert c.attention_grid.shape == model.layout.grid
    last = condition(model, ids, pv, query="last", max_new_tokens=2)
    assert last.reading.attention.positions == [n_prompt - 1]
    chosen = condition(model, ids, pv, query=[0, 5], max_new_tokens=1)
    assert chosen.reading.attention.positions == [0, 5]
    with pytest.raises(InputError, match="query positions"):
        condition(model, ids, pv, query=[10_000], max_new_tokens=1)


def test_prompts_and_clear_errors(tiny) -> None:
    _, model, _ = tiny
    assert prompt_text(model.vlm, "Hi?") == "USER: <image>\nHi? ASSISTANT:"
    assert prompt_text(model.vlm, "<image> Hi") == "<image> Hi"
    with pytest.raises(InputError, match="2 <image>"):
        prompt_text(model.vlm, "<image><image>")
    with pytest.raises(InputError, match="empty"):
        prompt_text(model.vlm, "  ")
    with pytest.raises(SpecError, match="hf-vlm"):
        vitreg.load("hf-vlm:/no/such/dir")
    with pytest.raises(InputError, match="not a VLM"):
        from vitreg.vlm import run_vlm

        run_vlm(vitreg.wrap(build("hf_clip_t16", img_size=SIZE)[0]), [], PROMPT, None)


def test_wrap_a_loaded_llava_and_refuse_sdpa(tiny, pixels) -> None:
    _, model, _ = tiny
    vlm = model.vlm
    wrapped = wrap_vlm(vlm.module, vlm.processor)
    assert wrapped.module is vlm.tower and wrapped.vlm.tokenizer is vlm.tokenizer
    assert wrapped.hook_names() == model.hook_names()
    with pytest.raises(SpecError, match="not a supported VLM"):
        wrap_vlm(vlm.tower)
    plain = vitreg.wrap(vlm.module)  # vitreg.wrap hands a LLaVA model to wrap_vlm
    assert plain.module is vlm.tower and plain.vlm.module is vlm.module
    pv = pixels[:1]
    ids = inputs(wrapped, pv)
    vlm.module.set_attn_implementation({"text_config": "sdpa"})
    try:
        with pytest.raises(InputError, match="eager"):
            read(wrapped, ids, pv, [ids.shape[1] - 1], [ids.shape[1] - 1])
    finally:
        vlm.module.set_attn_implementation({"text_config": "eager"})
    assert vlm.lm_attention == "eager"


def test_image_tokens_map_to_the_patch_grid_under_both_strategies(tiny) -> None:
    _, model, _ = tiny
    layout = model.layout_for((SIZE, SIZE))
    patches = torch.arange(float(layout.n_patches))
    default = to_grid(model, patches, (SIZE, SIZE))  # [CLS] dropped before the projector
    full = to_grid(model, torch.cat([torch.tensor([-1.0]), patches]), (SIZE, SIZE))
    assert torch.equal(default, patches.reshape(layout.grid)) and torch.equal(default, full)


def test_a_siglip_tower_with_the_full_strategy(tiny) -> None:
    """LLaVA variants with a SigLIP tower (no [CLS]) feed every token ("full"): the fix keeps
    the image-token count, and the maps cover the whole grid."""
    from transformers import (
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        SiglipVisionConfig,
    )

    _, clip_model, _ = tiny
    tokenizer = clip_model.vlm.tokenizer
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=clip_model.vlm.image_token_id,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = wrap_vlm(LlavaForConditionalGeneration(config).eval(), tokenizer=tokenizer)
    assert model.family == "hf-siglip" and model.layout.n_cls == 0
    neurons = NeuronSet([1, 1], [3, 7], [1.0, 1.0], n_layers=3, d_mlp=64)
    pv = torch.randn(1, 3, 32, 32)
    ids = inputs(model, pv)
    assert int((ids == model.vlm.image_token_id).sum()) == 16  # every token, no [CLS] to drop
    with TestTimeRegisters(neurons).applied(model):
        c = condition(model, ids, pv, query="last", max_new_tokens=2)
    assert c.reading.extra_norms.numel() == 1 and c.attention_grid.shape == (4, 4)
    assert float(c.attention_grid.sum()) == pytest.approx(float(c.reading.attention.mass.mean()))


def test_answer_change_numbers() -> None:
    assert edit_distance([1, 2, 3], [1, 3]) == 1 and edit_distance([], [4, 5]) == 2
    assert edit_distance([1, 2, 3], [3, 2, 1]) == 2
    c = answer_change([1, 2, 3, 4], [1, 9, 3, 4])
    assert c == AnswerChange(identical=False, edit_distance=1, edit_distance_normalized=0.25)
    logits = torch.tensor([2.0, 0.0, -1.0])
    same = first_token_change(logits, logits)
    assert isinstance(same, FirstTokenChange)
    assert same.kl == 0 and same.same_top_token and same.max_abs_logit_change == 0
    other = first_token_change(logits, torch.tensor([0.0, 2.0, -1.0]))
    p, q = torch.softmax(logits.double(), 0), torch.softmax(torch.tensor([0.0, 2, -1]).double(), 0)
    assert other.kl == pytest.approx(float((p * (p / q).log()).sum()))
    assert not other.same_top_token and other.max_abs_logit_change == 2


def test_cli_vlm_writes_a_report_with_both_maps(tiny, tmp_path: Path) -> None:
    folder, model, neurons = tiny
    images = tmp_path / "images"
    images.mkdir()
    for i, img in enumerate(synthetic_pil(2, SIZE, 3, 0.3)):
        img.save(images / f"{i}.png")
    neurons_file = neurons.save(tmp_path / "neurons")
    out = tmp_path / "run"
    args = ["vlm", f"hf-vlm:{folder}", "--images", str(images), "--prompt", PROMPT]
    args += ["--neurons", str(neurons_file), "--max-new-tokens", "3", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = validate_metrics(json.loads((out / "metrics.json").read_text()))
    assert doc.verb == "vlm" and doc.results.summary.n_images == 2
    s = doc.results.summary
    assert s.max_over_median_before > 10 > 2 > s.max_over_median_after
    assert {m.name for m in doc.metrics} >= {"vlm.identical_rate", "vlm.first_token_kl"}
    report = (out / "report.md").read_text()
    assert "feature norm" in report and "LM→image attention" in report
    assert (out / "figures" / "vlm_maps_0.png").is_file()
    assert (out / "figures" / "vlm_layers.png").is_file()
    html = (out / "report.html").read_text()
    assert html.count("data:image/webp;base64") >= 2
    assert "Image 1" in report and "answer" in report
    assert load_config(out / "config.yaml", "vlm").prompt == PROMPT  # --config reruns it
    assert CliRunner().invoke(app, ["validate", str(out)]).exit_code == 0


def test_vlm_options_are_the_config_fields() -> None:
    import inspect

    from vitreg.cli.options import verb_command
    from vitreg.verbs import VERBS

    params = inspect.signature(verb_command(VERBS["vlm"], print)).parameters
    fields = VlmConfig.model_fields
    options = set(params) - {"ctx", "config"}
    assert options <= set(fields)
    for name in options:
        field = fields[name]
        assert params[name].default.default == (None if field.is_required() else field.default)


def test_cli_vlm_rejects_a_non_vlm_spec(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["vlm", "planted:dinov2_s14", "--prompt", PROMPT])
    assert result.exit_code == 2
    assert "hf-vlm" in " ".join(result.stderr.split())


def test_a_generated_image_token_is_never_fed_back_as_a_placeholder(tiny, pixels) -> None:
    """An LM whose favourite next token is the image token (the untrained one picks it as any
    word) answers without it, and the read over prompt + answer keeps one image's tokens."""
    _, model, _ = tiny
    vlm = model.vlm
    image = vlm.image_token_id

    def favour_image(_mod, _args, out):
        out[..., image] += 100.0
        return out

    pv = pixels[:1]
    ids = inputs(model, pv)
    handle = vlm.module.lm_head.register_forward_hook(favour_image)
    try:
        got = condition(model, ids, pv, max_new_tokens=4)
    finally:
        handle.remove()
    assert int(got.reading.logits[0].argmax()) == image  # unsuppressed, it would come first
    assert len(got.results.answer_tokens) == 4 and image not in got.results.answer_tokens
    assert got.attention_grid.shape == (SIZE // 16, SIZE // 16)
