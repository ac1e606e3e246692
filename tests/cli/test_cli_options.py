"""The CLI's options are the configs' fields: for every verb, each option's default and help
are its config field's, so `--help`, config.yaml and the library cannot drift apart."""

from __future__ import annotations

import typer

from vitreg.cli.app import app
from vitreg.cli.options import REQUIRED
from vitreg.configs import (
    Figures,
    ImageSet,
    ModelSource,
    NeuronChoice,
    NeuronSearch,
    TtrSettings,
)
from vitreg.verbs import VERBS

#: every verb's config, read from its record
CONFIGS = {name: verb.config for name, verb in VERBS.items()}


def command(verb: str) -> typer.core.TyperCommand:
    """The click command of ``verb`` in the typer app."""
    group = typer.main.get_command(app)
    cmd = group
    for name in VERBS[verb].words:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def test_every_option_default_and_help_is_its_config_field():
    for verb, cls in CONFIGS.items():
        params = {p.name: p for p in command(verb).params}
        writes_config = hasattr(cls, "to_file")
        assert set(params) == {*cls.model_fields, *["config"] * writes_config}, verb
        for name, field in cls.model_fields.items():
            p = params[name]
            want = None if field.is_required() else field.get_default(call_default_factory=True)
            got = p.default
            unset = (None, (), [])  # an option left out: the config's default (None, no items)
            if field.is_required() and not writes_config:  # nothing else can give it
                assert p.required, (verb, name)
            else:
                assert got == want or (got in unset and want in unset), (verb, name, got, want)
            description = field.description.replace("<verb>", verb)
            required = field.is_required() and writes_config
            assert p.help == (f"{description} {REQUIRED}" if required else description)


def test_a_shared_setting_reads_the_same_in_every_verb():
    """Each field of a part (model source, images, neuron search, test-time registers, ...)
    has one help text in every verb that composes the part, unless a verb redefines it."""
    for part in (ModelSource, ImageSet, NeuronSearch, TtrSettings, NeuronChoice, Figures):
        verbs = [v for v, cls in CONFIGS.items() if issubclass(cls, part)]
        assert len(verbs) >= 2, part
        for name, field in part.model_fields.items():
            texts = {
                p.help
                for v in verbs
                for p in command(v).params
                if p.name == name and name not in vars(CONFIGS[v]).get("__annotations__", {})
            }
            assert len(texts) == 1, (part.__name__, name, texts)
            assert field.description in next(iter(texts)), (part.__name__, name)
    modes = {p.help for v in ("fix", "vlm", "probe") for p in command(v).params if p.name == "mode"}
    assert modes == {"paper (per-neuron max, Algorithm 2) or reference (the official code's edit)."}


def test_a_neuron_source_is_typed_and_reads_the_earlier_spellings(tmp_path):
    from vitreg.configs import FixConfig, ProbeRunConfig, VlmConfig
    from vitreg.verbs.probe import fix_plan

    assert FixConfig().neurons.kind == "discover" == FixConfig(neurons=None).neurons
    vlm = VlmConfig(spec="hf-vlm:x", prompt="what?", neurons="auto")  # vlm's old spelling
    assert vlm.neurons.kind == "discover" and vlm.to_file()["neurons"] == "discover"
    assert FixConfig(neurons="builtin").neurons.kind == "builtin"
    named = FixConfig(neurons=str(tmp_path / "neurons.json"))
    assert named.neurons.kind == "file" and named.to_file()["neurons"] == str(
        tmp_path / "neurons.json"
    )
    both = ProbeRunConfig(fix="both", neurons="builtin")
    assert fix_plan(both.fix, both.neurons) == (True, "builtin", True)
    only = ProbeRunConfig(fix="builtin")
    base, source, fixed = fix_plan(only.fix, only.neurons)
    assert (base, source.kind, fixed) == (False, "builtin", True)
