"""CLIP zero-shot and attention-map segmentation probes, offline: a tiny random-init open_clip
CLIP (its text tower and the BPE vocabulary open_clip ships) and a tiny HF ``CLIPModel`` with a
hand-made tokenizer. Logits and mIoU are checked against hand computations, planted cases give
the score they must, and ``vitreg probe --task zero-shot`` runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import vitreg
from vitreg.errors import InputError
from vitreg.models.text_tower import text_tower
from vitreg.probe.metrics import IGNORE_INDEX
from vitreg.probe.run import run
from vitreg.probe.tasks.attention_seg import (
    AttentionSeg,
    average_precision,
    segmentation_scores,
    segmentation_yardsticks,
)
from vitreg.probe.tasks.zero_shot import ZeroShot
from vitreg.probe.zero_shot.prompts import class_names, openai_templates, read_templates
from vitreg.probe.zero_shot.text import class_embeddings, clip_towers, zero_shot_logits

open_clip = pytest.importorskip("open_clip")

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
ARCH = "vitreg-tiny-clip"
CLS_DATA = "synthetic-cls:n=6,size=32"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_arch(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ViT-B-32-shaped open_clip architecture, 2 layers of each tower, 32 px input."""
    folder = tmp_path_factory.mktemp("open_clip_cfg")
    (folder / f"{ARCH}.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(folder)
    return ARCH


@pytest.fixture(scope="module")
def clip_model(tiny_arch: str):
    torch.manual_seed(0)
    return vitreg.load(f"open_clip:{tiny_arch}", pretrained=False)


def test_the_loader_keeps_the_text_tower_outside_the_vision_module(clip_model) -> None:
    tower = text_tower(clip_model.module)
    clip, tokenizer = tower.get()
    assert clip.visual is clip_model.module  # the wrapped tower is the CLIP's own
    names = set(clip_model.module.state_dict())
    assert not {"token_embedding.weight", "text_projection", "logit_scale"} & names
    assert all(m is not clip for m in clip_model.module.modules())  # not a submodule
    assert tokenizer(["a photo of a dog."]).shape == (1, 77)  # open_clip's BPE vocab, offline


def test_zero_shot_logits_equal_a_hand_computation(clip_model) -> None:
    clip, tokenizer = text_tower(clip_model.module).get()
    names, templates = ["dog", "red car"], ["a photo of a {}.", "a drawing of the {}"]
    torch.manual_seed(1)
    x = torch.randn(3, 3, 32, 32)
    towers = clip_towers(clip_model)
    got = zero_shot_logits(towers.images(x), class_embeddings(towers, names, templates),
                           towers.logit_scale)  # fmt: skip
    with torch.no_grad():
        image = clip.visual(x)
        image = image / image.norm(dim=-1, keepdim=True)
        rows = []
        for name in names:
            text = clip.encode_text(tokenizer([t.replace("{}", name) for t in templates]))
            text = text / text.norm(dim=-1, keepdim=True)
            mean = text.mean(0)
            rows.append(mean / mean.norm())
        want = clip.logit_scale.exp() * image @ torch.stack(rows).T
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_planted_image_embeddings_give_top1_one(clip_model) -> None:
    """Image embeddings that are the class text embeddings (scaled) are classified exactly."""
    from vitreg.data.datasets import open_dataset

    task = ZeroShot()
    ds = open_dataset("synthetic-cls:n=4,size=32", "val")
    ds.class_names = [f"class {i}" for i in range(8)]  # 8 names: top-5 is informative
    task.setup(clip_model, ds, {"templates": None})
    labels = torch.tensor([0, 3, 7, 5, 5, 1])
    planted = task.score(3.0 * task.classes[labels], labels, "image embedding")
    values = {s.metric: s.values[0] for s in planted.scores}
    assert values == {"top1": 1.0, "top5": 1.0}
    shifted = task.score(task.classes[(labels + 1) % 8], labels, "image embedding")
    assert shifted.scores[0].values == [0.0]
    assert planted.info.templates == 80 and planted.info.num_classes == 8
    assert {(y.metric, y.value) for y in planted.yardsticks} == {("top1", 1 / 8), ("top5", 5 / 8)}


def test_probe_run_scores_base_and_fixed_on_the_test_split(clip_model, tmp_path: Path) -> None:
    from vitreg.fix import TestTimeRegisters
    from vitreg.fix.neuron_set import NeuronSet

    fix = TestTimeRegisters(NeuronSet([0, 1], [3, 7], [1.0, 1.0]))
    result = run(clip_model, "zero-shot", CLS_DATA, fix=fix, cache_dir=tmp_path, batch_size=4)
    doc = result.results.model_dump(mode="json")
    assert list(doc["conditions"]) == ["base", "fixed"]
    assert doc["caches"]["base/test"]["n"] == 6  # the val split only
    for c in ("base", "fixed"):
        (layer,) = doc["conditions"][c]
        assert layer["scores"][0]["metric"] == "top1" and layer["layer"] == "image embedding"
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert [p.parent.name for p in files] == ["zero-shot-classes"]  # no features cached
    again = run(clip_model, "zero-shot", CLS_DATA, cache_dir=tmp_path, batch_size=4)
    (layer,) = again.results.conditions["base"]
    assert any("class embeddings read from" in n for n in layer.notes)
    assert layer.scores[0].values == doc["conditions"]["base"][0]["scores"][0]["values"]


def test_folder_class_names_and_a_counted_bad_image(clip_model, tmp_path: Path) -> None:
    """imagefolder: the prompts use the folder names; an unreadable image is skipped, counted."""
    from PIL import Image

    for cls, colour in (("golden_retriever", "orange"), ("tabby_cat", "grey")):
        (tmp_path / "val" / cls).mkdir(parents=True)
        Image.new("RGB", (40, 40), colour).save(tmp_path / "val" / cls / "a.png")
    (tmp_path / "val" / "tabby_cat" / "broken.png").write_bytes(b"not a png")
    result = run(clip_model, "zero-shot", f"imagefolder:{tmp_path}", cache_dir=tmp_path / "c")
    (layer,) = result.results.conditions["base"]
    assert layer.info.num_classes == 2 and layer.scores[0].n_test == 2
    assert "2 class names had '_' turned into spaces" in layer.notes
    assert sum(result.results.caches["base/test"].skipped.values()) == 1
    assert sum(result.results.data.test.log.values()) == 1


def test_a_timm_clip_tower_has_no_text_tower(tmp_path: Path) -> None:
    model = vitreg.load("timm:vit_tiny_patch16_224", pretrained=False, img_size=32)
    with pytest.raises(InputError, match="open_clip"):
        run(model, "zero-shot", CLS_DATA, cache_dir=tmp_path)


def test_templates_files_and_class_names(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("a photo of a {}.\n\n  itap of the {}  \n")
    assert read_templates(good) == ["a photo of a {}.", "itap of the {}"]
    bad = tmp_path / "bad.txt"
    bad.write_text("a photo of a {}.\nno slot here\n")
    with pytest.raises(InputError, match="exactly one"):
        read_templates(bad)
    templates = openai_templates()
    assert len(templates) == 80 and all(t.count("{}") == 1 for t in templates)
    shipped = read_templates(
        Path(vitreg.__file__).parent / "probe/zero_shot/openai_imagenet_templates.txt"
    )
    assert shipped == templates
    assert class_names(["golden_retriever", "cat"], "x")[0] == ["golden retriever", "cat"]
    wnids = [f"n{i:08d}" for i in range(1000)]
    names, notes = class_names(wnids, "imagenet")
    assert names[0] == "tench" and notes
    with pytest.raises(InputError, match="WordNet"):
        class_names(wnids[:10], "x")


# attention-map segmentation ------------------------------------------------------------------
def test_attention_seg_scores_equal_a_hand_computation() -> None:
    """Maps at mask resolution (no interpolation): thresholds at each image's normalised mean."""
    maps = torch.tensor([[[0.9, 0.1], [0.1, 0.1]], [[0.1, 0.2], [0.3, 0.9]]])
    masks = torch.tensor([[[1, 1], [0, 0]], [[0, IGNORE_INDEX], [2, 2]]])
    # image 1: foreground predicted at the top left; image 2 at the bottom right
    # fg: 2 hits of 4 in the union -> 1/2; bg: 3 of 5 -> 3/5; pixels: 5 of 7 right
    found = segmentation_scores(maps, masks)
    assert found["miou"] == pytest.approx((1 / 2 + 3 / 5) / 2)
    assert found["pixel_acc"] == pytest.approx(5 / 7)
    # image 1: fg AP 0.75 (ranks 1, then a 3-way tie holding 1 of the 2), bg AP 2/3 (a 3-way
    # tie holding both); image 2: both pixel sets rank perfectly, AP 1 and 1
    ap1, ap2 = (0.75 + 2 / 3) / 2, 1.0
    assert found["map"] == pytest.approx((ap1 + ap2) / 2)
    assert segmentation_scores(maps, AttentionSeg().keep(masks)) == found  # what is kept
    marks = {(y.name, y.metric): y.value for y in segmentation_yardsticks(masks, (2, 2))}
    # all foreground: fg IoU 4/7, bg IoU 0; all background: bg IoU 3/7, fg IoU 0
    assert marks["all foreground", "miou"] == pytest.approx(2 / 7)
    assert marks["all background", "pixel_acc"] == pytest.approx(3 / 7)
    # the centre prior on a 2x2 grid is flat: nothing passes its mean, all background
    assert marks["centre prior", "miou"] == pytest.approx(3 / 14)


def test_pooled_miou_matches_torchmetrics_and_ignores_chunking(monkeypatch) -> None:
    from vitreg.probe import metrics
    from vitreg.probe.tasks import attention_seg

    g = torch.Generator().manual_seed(0)
    maps = torch.rand(5, 4, 4, generator=g)
    masks = torch.randint(0, 3, (5, 16, 16), generator=g)
    masks[:, :2] = IGNORE_INDEX
    found = segmentation_scores(maps, masks)
    _, fg = attention_seg.binarise(maps, (16, 16))
    truth = torch.where(masks == IGNORE_INDEX, IGNORE_INDEX, (masks != 0).long())
    assert found["miou"] == pytest.approx(metrics.miou(fg.long(), truth, 2, IGNORE_INDEX))
    monkeypatch.setattr(attention_seg, "CHUNK", 2)
    assert segmentation_scores(maps, masks) == pytest.approx(found)


def test_average_precision_matches_scikit_learn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    score = torch.randint(0, 5, (200,), generator=g).float()  # many ties
    y = torch.rand(200, generator=g) < 0.3
    want = metrics.average_precision_score(y.numpy(), score.numpy())
    assert average_precision(score, y) == pytest.approx(want)


def test_attention_seg_reads_the_last_cls_row_over_patches(clip_model) -> None:
    task = AttentionSeg()
    x = torch.randn(2, 3, 32, 32)
    name = task.layer(clip_model)
    assert name == "blocks.1.attn.hook_pattern"
    _, cache = clip_model.run_with_cache(x, names=[name])
    pattern = cache[name]  # [B, H, N, N], [CLS] first, 4x4 patches after
    want = pattern.mean(1)[:, 0, 1:].reshape(2, 4, 4)
    torch.testing.assert_close(task.outputs(clip_model, x), want)


def test_attention_seg_runs_with_and_without_the_fix(clip_model, tmp_path: Path) -> None:
    from vitreg.fix import TestTimeRegisters
    from vitreg.fix.neuron_set import NeuronSet

    fix = TestTimeRegisters(NeuronSet([0], [5], [1.0]))
    result = run(clip_model, "attention-seg", "synthetic-seg:n=6,size=32", fix=fix,
                 cache_dir=tmp_path, batch_size=4)  # fmt: skip
    for c in ("base", "fixed"):
        (layer,) = result.results.conditions[c]
        metrics = {s.metric: s.values[0] for s in layer.scores}
        assert set(metrics) == {"miou", "pixel_acc", "map"}
        assert all(0.0 <= v <= 1.0 for v in metrics.values())


def test_attention_seg_needs_masks_with_a_background_class(clip_model, tmp_path: Path) -> None:
    from vitreg.data.datasets import open_dataset

    with pytest.raises(InputError, match="mask"):
        run(clip_model, "attention-seg", CLS_DATA.replace("cls", "depth"), cache_dir=tmp_path)
    ds = open_dataset("synthetic-seg:n=2,size=32", "val")
    ds.class_names = ["wall", "floor", "sky", "tree"]  # ADE20K-like: no background
    with pytest.raises(InputError, match="background"):
        AttentionSeg().setup(clip_model, ds, {})


# the CLI -------------------------------------------------------------------------------------
def test_cli_probe_zero_shot_on_a_random_init_open_clip(tiny_arch: str, tmp_path: Path) -> None:
    from vitreg.cli.app import app

    templates = tmp_path / "templates.txt"
    templates.write_text("a photo of a {}.\na {} shape\n")
    args = ["probe", f"open_clip:{tiny_arch}", "--random-init", "--task", "zero-shot",
            "--data", CLS_DATA, "--templates", str(templates), "--batch-size", "4",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "run")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "run" / "metrics.json").read_text())
    (layer,) = doc["results"]["conditions"]["base"]
    assert layer["info"]["templates"] == 2 and layer["scores"][0]["metric"] == "top1"
    report = (tmp_path / "run" / "report.md").read_text()
    assert "top1" in report and "Nothing is trained" in report
    wrong = CliRunner().invoke(app, [*args[:4], "classification", *args[5:]])
    assert wrong.exit_code == 2 and "zero-shot and ov-seg only" in " ".join(wrong.stderr.split())


# Hugging Face CLIP ---------------------------------------------------------------------------
def tiny_hf_clip(folder: Path) -> None:
    """A random ``CLIPModel`` and a character-level ``CLIPTokenizer`` saved offline."""
    transformers = pytest.importorskip("transformers")
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz"))
    vocab = {c: i for i, c in enumerate(chars)}
    vocab |= {f"{c}</w>": len(vocab) + i for i, c in enumerate(chars)}
    vocab |= {"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tok = transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tok.save_pretrained(folder)
    ids = {"bos_token_id": vocab["<|startoftext|>"], "eos_token_id": vocab["<|endoftext|>"]}
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=32, pad_token_id=ids["eos_token_id"],
                **ids)  # fmt: skip
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, image_size=32, patch_size=8)  # fmt: skip
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    torch.manual_seed(0)
    transformers.CLIPModel(config).eval().save_pretrained(folder)


def test_hf_clip_zero_shot_logits_equal_a_hand_computation(tmp_path: Path) -> None:
    tiny_hf_clip(tmp_path)
    from transformers import CLIPModel, CLIPTokenizer

    model = vitreg.load(f"hf:{tmp_path}")
    towers = clip_towers(model)
    names, templates = ["dog", "cat"], ["a photo of a {}", "the {}"]
    x = torch.randn(2, 3, 32, 32)
    got = zero_shot_logits(towers.images(x), class_embeddings(towers, names, templates),
                           towers.logit_scale)  # fmt: skip
    clip, tok = CLIPModel.from_pretrained(tmp_path).eval(), CLIPTokenizer.from_pretrained(tmp_path)
    with torch.no_grad():
        image = F.normalize(clip.visual_projection(clip.vision_model(x).pooler_output), dim=-1)
        rows = []
        for name in names:
            batch = tok([t.format(name) for t in templates], padding=True, return_tensors="pt")
            text = clip.text_model(**batch).pooler_output
            rows.append(F.normalize(F.normalize(clip.text_projection(text), dim=-1).mean(0), dim=0))
        want = clip.logit_scale.exp() * image @ torch.stack(rows).T
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_hf_without_a_tokenizer_or_a_text_tower_is_refused(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    text = dict(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=16)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=32, patch_size=8)  # fmt: skip
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    transformers.CLIPModel(config).save_pretrained(tmp_path / "no_tokenizer")
    with pytest.raises(InputError, match="tokenizer"):
        clip_towers(vitreg.load(f"hf:{tmp_path / 'no_tokenizer'}"))
    transformers.CLIPVisionModel(config.vision_config).save_pretrained(tmp_path / "vision")
    with pytest.raises(InputError, match="not a full CLIPModel"):
        clip_towers(vitreg.load(f"hf:{tmp_path / 'vision'}"))


def test_hf_clip_zero_shot_runs_bare_and_fixed(tmp_path: Path) -> None:
    from vitreg.fix import TestTimeRegisters
    from vitreg.fix.neuron_set import NeuronSet

    tiny_hf_clip(tmp_path)
    model = vitreg.load(f"hf:{tmp_path}")
    fix = TestTimeRegisters(NeuronSet([0, 1], [3, 9], [1.0, 1.0]))
    result = run(model, "zero-shot", CLS_DATA, fix=fix, cache_dir=tmp_path / "c", batch_size=4)
    for c in ("base", "fixed"):
        (layer,) = result.results.conditions[c]
        assert layer.info.clip.startswith("hf:") and layer.scores[0].n_test == 6


def test_20000_templates_are_refused_and_class_prompts_report_progress(
    clip_model, tmp_path: Path
) -> None:
    from vitreg.probe.zero_shot.class_cache import cached_class_embeddings

    many = tmp_path / "many.txt"
    many.write_text("".join(f"photo {i} of a {{}}.\n" for i in range(20_000)))
    with pytest.raises(InputError, match="holds 20,000 templates; vitreg averages at most 1,000"):
        read_templates(many)
    towers = clip_towers(clip_model)
    with pytest.raises(InputError, match="prompts, above the 2,000,000"):
        class_embeddings(towers, ["x"] * 3000, ["a {}"] * 1000)
    phases: list[tuple[int | None, str, list[int]]] = []

    class Recorder:
        def __call__(self, total, label):
            import contextlib

            seen: list[int] = []
            phases.append((total, label, seen))
            return contextlib.nullcontext(lambda done, **_: seen.append(done))

        def note(self, message: str) -> None:
            pass

    templates = [f"photo {i} of a {{}}." for i in range(300)]
    cached_class_embeddings(towers, ["cat", "dog"], templates, tmp_path / "cache", Recorder())
    [(total, label, seen)] = phases
    assert total == 600 and "2 class names × 300 templates" in label and seen == [256, 512, 600]
