"""The README's Python snippets run as written, with the planted demo model at 112 px standing in
for the pretrained spec, synthetic images for the user's photos and no downloads."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

import vitreg

README = Path(__file__).resolve().parents[1] / "README.md"
SUBSTITUTIONS = [
    # any model spec but the VLM section's offline LLaVA -> the planted demo (a real timm
    # ViT-S/14, random weights, planted outliers)
    (
        r'vitreg\.load\("(?!hf-vlm:)[^"]+"(?:, img_size=\d+)?\)',
        'vitreg.load("planted:dinov2_s14", img_size=112)',
    ),
    # the user's photos -> synthetic photos with flat regions (what the planted neurons fire on)
    (
        r"^(\w+) = \[Image\.open\(p\)\.convert\(\"RGB\"\) for p in .*\]",
        r"\1 = synthetic_pil(8, 112)",
    ),
    (r"img_size=224", "img_size=112"),
    (r"pretrained=True", "pretrained=False"),  # no downloads in tests
]


@cache
def planted() -> vitreg.Model:
    """The planted demo at 112 px, built once for every snippet (they leave it unchanged)."""
    return vitreg.load("planted:dinov2_s14", img_size=112)


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def runnable(code: str) -> str:
    """``code`` with the substitutions applied."""
    for pattern, new in SUBSTITUTIONS:
        code = re.sub(pattern, new, code, flags=re.M)
    return "from vitreg.testing import synthetic_pil\n" + code


def test_snippets_that_load_a_model_preprocess_its_inputs():
    """Inputs come from ``model.preprocess`` (raw [0, 1] tensors give other numbers than the CLI)."""
    loading = [code for code in snippets() if "vitreg.load(" in code]
    assert len(loading) >= 3
    for code in loading:
        assert "model.preprocess(" in code, code


@pytest.mark.parametrize("index", range(len(snippets())))
def test_snippet_runs(index, tmp_path, monkeypatch):
    code = snippets()[index]
    monkeypatch.chdir(tmp_path)  # snippets write runs/, fixed/, my_neurons.* where they run
    exec(compile(runnable(code), f"README.md python block {index}", "exec"), {"planted": planted})
