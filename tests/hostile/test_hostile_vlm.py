"""Hostile ``hf-vlm:DIR`` folders and chat templates: each folder is checked before transformers
reads it (custom code, model_type, sizes, image-token id, weights files, templates) and every
chat template renders in vitreg's budgeted Jinja sandbox -- a named error, never a bug report,
an allocation failure or a render that runs for minutes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

import vitreg
from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app
from vitreg.errors import InputError, SpecError, UnsupportedModelError, WeightsError
from vitreg.models.loaders.chat_template import render_chat_template
from vitreg.models.loaders.hf_vlm import VLM
from vitreg.vlm.inputs import prompt_text

pytest.importorskip("transformers")
runner = CliRunner()
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vitreg.testing.planted import save_tiny_llava

    return save_tiny_llava(tmp_path_factory.mktemp("vlm") / "llava")


def edit_config(folder: Path, name: str = "config.json", **changes) -> None:
    path = folder / name
    config = json.loads(path.read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            config[section][field] = value
        elif value is None:
            config.pop(section, None)
        else:
            config[section] = value
    path.write_text(json.dumps(config))


def hostile(folder: Path, case: str) -> None:
    """Make the copy of a valid tiny LLaVA folder hostile in one way."""
    if case == "no_model_type":
        edit_config(folder, model_type=None)
    elif case == "auto_map":
        edit_config(folder, auto_map={"AutoModel": "evil.EvilModel"})
    elif case == "auto_map_tokenizer":
        edit_config(folder, "tokenizer_config.json", auto_map={"AutoTokenizer": ["evil.T", None]})
    elif case == "other_model_type":
        edit_config(folder, model_type="bert")
    elif case == "huge_text":
        edit_config(folder, text_config__hidden_size=60000, text_config__intermediate_size=200000)
    elif case == "text_size_string":
        edit_config(folder, text_config__num_hidden_layers="2")
    elif case == "image_token_out_of_range":
        edit_config(folder, image_token_index=10**6)
    elif case == "feature_layer_list":
        edit_config(folder, vision_feature_layer=[-2, -1])
    elif case == "feature_layer_string":
        edit_config(folder, vision_feature_layer="-2")
    elif case == "pickle_weights":
        torch.save({"w": torch.zeros(2)}, folder / "model.safetensors")
    elif case == "truncated_weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif case == "template_syntax":
        (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.role }")
    elif case == "template_in_json":
        edit_config(folder, "processor_config.json", chat_template="{% if %}")
    elif case == "deep_json":
        (folder / "processor_config.json").write_text("[" * 10_000 + "]" * 10_000)


CASES = {
    "no_model_type": (InputError, "has no model_type"),
    "auto_map": (InputError, "config.json names custom code (auto_map"),
    "auto_map_tokenizer": (InputError, "tokenizer_config.json names custom code"),
    "other_model_type": (SpecError, "model_type 'bert'"),
    "huge_text": (InputError, "billion parameters"),
    "text_size_string": (InputError, "text_config.num_hidden_layers is '2'"),
    "image_token_out_of_range": (InputError, "image_token_index 1000000 is outside the vocabulary"),
    "feature_layer_list": (UnsupportedModelError, "vision_feature_layer is [-2, -1] (several"),
    "feature_layer_string": (InputError, "vision_feature_layer is '-2', not a layer index"),
    "pickle_weights": (WeightsError, "model.safetensors is not a readable safetensors file"),
    "truncated_weights": (WeightsError, "model.safetensors is not a readable safetensors file"),
    "template_syntax": (InputError, "chat_template.jinja: the chat template is not valid Jinja"),
    "template_in_json": (InputError, "processor_config.json: the chat template is not valid"),
    "deep_json": (InputError, "nests more than 64 levels"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_vlm_folder_is_named_before_transformers_reads_it(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    import transformers

    folder = Path(shutil.copytree(saved, tmp_path / "llava"))
    hostile(folder, case)

    def refuse(*args, **kwargs):
        raise AssertionError("transformers read the folder before vitreg checked it")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)
    kind, needle = CASES[case]
    for pretrained in (True, False):
        with pytest.raises(kind, match="^") as err:
            vitreg.load(f"hf-vlm:{folder}", pretrained=pretrained)
        assert needle in str(err.value) and len(str(err.value)) < 600, str(err.value)


@pytest.mark.parametrize("case", ["auto_map", "huge_text", "template_syntax", "feature_layer_list"])
def test_hostile_vlm_folder_on_the_cli_is_one_paragraph(saved: Path, tmp_path: Path, case) -> None:
    folder = Path(shutil.copytree(saved, tmp_path / "llava"))
    hostile(folder, case)
    result = runner.invoke(app, ["inspect", f"hf-vlm:{folder}"])
    assert_clean_failure(result, CASES[case][1])


@pytest.mark.parametrize("name", ["model.safetensors", "vitreg_planted.json"])
def test_a_vlm_file_linked_outside_the_folder_is_refused_unread(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    import transformers

    folder = Path(shutil.copytree(saved, tmp_path / "llava"))
    moved = tmp_path / f"elsewhere-{name}"
    (folder / name).rename(moved)
    (folder / name).symlink_to(moved)

    def refuse(*args, **kwargs):
        raise AssertionError("transformers read the folder before vitreg checked it")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)
    with pytest.raises(InputError, match=f"entry '.*{name}' leads .*elsewhere-{name}"):
        vitreg.load(f"hf-vlm:{folder}")
    result = runner.invoke(app, ["inspect", f"hf-vlm:{folder}"])
    assert_clean_failure(result, "outside the folder")
    assert "synthetic: a tiny LLaVA" not in result.output  # the linked file is never echoed


def test_the_valid_folder_still_loads(saved: Path) -> None:
    model = vitreg.load(f"hf-vlm:{saved}", pretrained=False)
    assert model.vlm.image_token_id == 4


# -- chat templates: rendered by vitreg, sandboxed and budgeted ----------------------------------

MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
TEMPLATES = {
    "dunder": ("{{ messages.__class__.__init__.__globals__ }}", "sandbox blocks"),
    "subclasses": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "sandbox blocks"),
    "nested_loops": (
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "ran past vitreg's budget",
    ),
    "output_flood": (
        "{% for a in range(100000) %}{% for b in range(100000) %}xxxxxxxx{% endfor %}{% endfor %}",
        "ran past vitreg's budget",
    ),
    "string_bomb": ("{{ 'x' * 10**9 }}", "ran past vitreg's budget"),
    "filter_bomb": ("{{ 'x' | center(10000000) }}", "ran past vitreg's budget"),
    "list_bomb": ("{% for x in [1] * 100000000 %}{% endfor %}", "ran past vitreg's budget"),
    "recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
    "raise_exception": ("{{ raise_exception('no images') }}", "TemplateError: no images"),
    "syntax": ("{% for m in messages %}", "not valid Jinja"),
}


@pytest.mark.parametrize("case", sorted(TEMPLATES))
def test_hostile_chat_template_is_a_named_error(case: str) -> None:
    text, needle = TEMPLATES[case]
    vlm = VLM(None, None, SimpleNamespace(chat_template=text), "hf-vlm:evil")
    with pytest.raises(InputError, match="the chat template") as err:
        prompt_text(vlm, "What is shown?")
    message = str(err.value)
    assert needle in message and "hf-vlm:evil" in message and len(message) < 500, message


def test_a_chat_template_renders_the_conversation() -> None:
    text = (
        "{% for m in messages %}{{ m.role | upper }}: {% for c in m.content %}"
        "{% if c.type == 'image' %}<image>\n{% else %}{{ c.text }}{% endif %}{% endfor %}"
        "{% endfor %}{% if add_generation_prompt %} ASSISTANT:{% endif %}"
    )
    assert render_chat_template(text, "t", messages=MESSAGES, add_generation_prompt=True) == (
        "USER: <image>\nhi ASSISTANT:"
    )
    vlm = VLM(None, None, SimpleNamespace(chat_template=text), "hf-vlm:x")
    assert prompt_text(vlm, "What?") == "USER: <image>\nWhat? ASSISTANT:"
