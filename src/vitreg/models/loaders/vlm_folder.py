"""An ``hf-vlm:DIR`` folder checked before transformers sees it: every JSON file read by the one
reader (size, depth, UTF-8), no custom code (``auto_map``), a LLaVA ``model_type``, sizes a
machine can build, an image-token id inside the vocabulary, one vision feature layer, weights files that are safetensors,
and chat templates that compile in the sandbox. Each problem is an :class:`InputError` (or
:class:`WeightsError`) naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitreg.core.readers import read_json
from vitreg.errors import InputError, SpecError, UnsupportedModelError, WeightsError, brief
from vitreg.models.loaders.chat_template import compile_template

MODEL_TYPES = ("llava",)
JSON_FILES = (
    "config.json",
    "tokenizer_config.json",
    "processor_config.json",
    "preprocessor_config.json",
    "chat_template.json",
    "generation_config.json",
)
MAX_JSON = 4 * 2**20  # bytes of one config file (tokenizer.json, the vocabulary, is not read)
MAX_VLM_PARAMS = 100_000_000_000  # the largest LLaVA models have about 70 billion
# bounds of the size fields of the language model and the vision tower
BOUNDS = {
    "hidden_size": 2**16,
    "intermediate_size": 2**18,
    "num_hidden_layers": 512,
    "num_attention_heads": 1024,
    "vocab_size": 2**22,
    "image_size": 4096,
    "patch_size": 4096,
}


def _config_files(folder: Path) -> dict[str, Any]:
    """Every JSON config file of the folder, read (file name -> content)."""
    found = {}
    for name in JSON_FILES:
        if (folder / name).is_file():
            found[name] = read_json(folder / name, "VLM file", max_bytes=MAX_JSON, allow_nan=True)
    if "config.json" not in found:
        raise InputError(
            f"hf-vlm:{folder} has no config.json; pass a folder written by "
            "LlavaForConditionalGeneration.save_pretrained (with its processor)"
        )
    return found


def _no_custom_code(folder: Path, files: dict[str, Any]) -> None:
    for name, content in files.items():
        if isinstance(content, dict) and "auto_map" in content:
            raise InputError(
                f"{folder / name} names custom code (auto_map: {brief(content['auto_map'], 60)}); "
                "vitreg loads only the LLaVA classes transformers ships and never runs code from "
                "a model folder: remove auto_map, or use a model without custom code"
            )


def _sizes(path: Path, config: dict[str, Any]) -> int:
    """The size fields of the text and vision configs, each a bounded whole number; the
    parameter count they imply (roughly, enough to refuse what no machine builds)."""
    total = 0
    for section in ("text_config", "vision_config"):
        sub = config.get(section, {})
        if not isinstance(sub, dict):
            raise InputError(f"{path}: {section} is {brief(sub, 40)}, not an object")
        for key, top in BOUNDS.items():
            value = sub.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top
            ):
                raise InputError(
                    f"{path}: {section}.{key} is {brief(value, 40)}; it must be a whole number "
                    f"from 1 to {top:,}"
                )
        width = sub.get("hidden_size") or 4096
        inner = sub.get("intermediate_size") or 4 * width
        depth = sub.get("num_hidden_layers") or 32
        total += depth * (4 * width * width + 3 * width * inner)
        total += 2 * (sub.get("vocab_size") or 0) * width
    if total > MAX_VLM_PARAMS:
        raise InputError(
            f"{path}: text_config and vision_config give about {total / 1e9:.0f} billion "
            f"parameters, above the {MAX_VLM_PARAMS / 1e9:.0f} billion vitreg builds; this is not "
            "a LLaVA model a machine can hold"
        )
    return total


def _image_token(path: Path, config: dict[str, Any]) -> None:
    key = "image_token_id" if "image_token_id" in config else "image_token_index"
    token = config.get(key)
    vocab = (config.get("text_config") or {}).get("vocab_size")
    if token is None:
        return  # transformers' default applies
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise InputError(f"{path}: {key} is {brief(token, 40)}, not a token id")
    if isinstance(vocab, int) and token >= vocab:
        raise InputError(
            f"{path}: {key} {token} is outside the vocabulary of text_config.vocab_size {vocab}; "
            "the image token must be one of the model's tokens"
        )


def _feature_layer(path: Path, config: dict[str, Any]) -> None:
    """``vision_feature_layer`` is one whole number: vitreg maps one layer's tokens to the image
    tokens (a list concatenates several layers, and changes the projector's input size)."""
    layer = config.get("vision_feature_layer")
    if layer is None:
        return  # transformers' default applies
    if isinstance(layer, list):
        raise UnsupportedModelError(
            f"{path}: vision_feature_layer is {brief(layer, 40)} (several layers concatenated), "
            "which vitreg does not support: it maps one feature layer's tokens to the image "
            "tokens; use a LLaVA model that reads one layer"
        )
    if isinstance(layer, bool) or not isinstance(layer, int) or not -4096 <= layer <= 4096:
        raise InputError(f"{path}: vision_feature_layer is {brief(layer, 40)}, not a layer index")


def _weights(folder: Path) -> None:
    """Every ``*.safetensors`` file opens as safetensors (its header covers the whole file)."""
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise WeightsError(
                f"{path} is not a readable safetensors file ({first}); it is truncated, "
                "corrupt or another format under this name: re-save the model"
            ) from None


def no_safetensors(folder: Path) -> WeightsError:
    """The error of a VLM folder whose weights transformers found no safetensors file of: its
    pickled files are named and never read."""
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    held = f"it holds {', '.join(pickled[:3])} (pickled torch files, " if pickled else "("
    return WeightsError(
        f"the VLM folder {str(folder)!r} has no readable model.safetensors: {held}which "
        "vitreg never unpickles, since unpickling can run any code). Convert the weights once "
        "to safetensors on a machine you trust (save_pretrained writes model.safetensors) or "
        "pass --random-init to build the architecture with random weights"
    )


def _templates(folder: Path, files: dict[str, Any]) -> None:
    """Every chat template of the folder compiles in the sandbox (rendering is budgeted later)."""
    found: list[tuple[str, Any]] = []
    if (folder / "chat_template.jinja").is_file():
        text = (folder / "chat_template.jinja").read_bytes()[: 2**20].decode("utf-8", "replace")
        found.append(("chat_template.jinja", text))
    for name, content in files.items():
        template = content.get("chat_template") if isinstance(content, dict) else None
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            found += [(name, t.get("template") if isinstance(t, dict) else t) for t in template]
        elif template is not None:
            found.append((name, template))
    for name, text in found:
        compile_template(text, str(folder / name))


def check_vlm_folder(folder: Path) -> None:
    """Refuse an ``hf-vlm:DIR`` folder transformers should not be given (see the module)."""
    files = _config_files(folder)
    _no_custom_code(folder, files)
    path, config = folder / "config.json", files["config.json"]
    if not isinstance(config, dict):
        raise InputError(f"{path} holds {brief(config, 40)}, not an object")
    model_type = config.get("model_type")
    if model_type is None:
        raise InputError(
            f"{path} has no model_type; an hf-vlm: folder is a LLaVA model saved by "
            "save_pretrained (model_type 'llava')"
        )
    if model_type not in MODEL_TYPES:
        raise SpecError(
            f"{path}: model_type {brief(model_type, 40)}; hf-vlm covers {list(MODEL_TYPES)}"
        )
    _sizes(path, config)
    _image_token(path, config)
    _feature_layer(path, config)
    _weights(folder)
    _templates(folder, files)
