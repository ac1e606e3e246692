"""The typed descriptions of a run's inputs: each fix method reads as its own model, a fix,
task or data set vitreg does not know keeps its fields in a typed ``other`` (the run is not
lost after its analysis), a NeuronSet's settings survive an older shape, and a field the
writer left out stays out of the file."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from vitreg.results.experiment import VariantOptions
from vitreg.results.fix import (
    AblateDescription,
    ComposedDescription,
    FixDescription,
    LastBlockDescription,
    OtherFixDescription,
    TtrDescription,
)
from vitreg.results.neurons import NeuronSetSettings
from vitreg.results.probe import DataSetRecord, TaskInfo
from vitreg.results.train import DinoOptions, ResolvedTrainConfig

FIX = TypeAdapter(FixDescription)
TTR = {"name": "ttr", "n_neurons": 5, "layers": [6, 7], "n_registers": 1, "cls": "zero",
       "patches": "zero", "mode": "paper", "seed": 0, "scale": 1.0}  # fmt: skip
NACLIP = {"name": "naclip", "method": "naclip", "source": "Hajimiri et al.", "block": "last",
          "residual": False, "ffn": False, "gaussian_std": 5.0}  # fmt: skip


def read_back(adapter: TypeAdapter[Any], value: dict[str, Any]) -> Any:
    """``value`` read, checked to be written back as it was read, and returned as read."""
    found = adapter.validate_python(value)
    assert adapter.dump_python(found, mode="json") == value
    return found


@pytest.mark.parametrize(
    ("described", "kind"),
    [
        (TTR, TtrDescription),
        (NACLIP, LastBlockDescription),
        ({**NACLIP, "method": "clearclip"} | {"gaussian_std": None}, LastBlockDescription),
        ({"name": "_Ablate", "method": "ablate", "n_neurons": 3}, AblateDescription),
        ({"name": "ComposedFix", "method": "ttr+naclip", "parts": [TTR, NACLIP]}, ComposedDescription),
        ({"name": "MyFix"}, OtherFixDescription),
    ],
)  # fmt: skip
def test_each_fix_reads_as_its_own_model(described: dict[str, Any], kind: type) -> None:
    assert type(read_back(FIX, described)) is kind


def test_a_fix_task_or_data_set_vitreg_does_not_know_keeps_its_fields_in_other() -> None:
    mine = FIX.validate_python({"name": "MyFix", "strength": 0.5, "table": {"a": [1, 2]}})
    assert mine.other == {"strength": 0.5, "table": '{"a": [1, 2]}'}
    assert FIX.validate_python(FIX.dump_python(mine, mode="json")) == mine
    info = TaskInfo.model_validate({"num_classes": 3, "my_count": 7})
    assert info.num_classes == 3 and info.other == {"my_count": 7}
    assert info.model_dump(mode="json") == {"num_classes": 3, "other": {"my_count": 7}}
    data = DataSetRecord.model_validate({"spec": "mine:x", "n": 4, "source": ["a", "b"]})
    assert data.other == {"source": ["a", "b"]} and data.split is None


def test_left_out_stays_out_and_given_none_stays_in() -> None:
    """ov-seg writes ``area_thd: None`` (no area threshold): kept; a field no task wrote is
    not added to the file."""
    read_back(TypeAdapter(TaskInfo), {"num_classes": 21, "logit_scale": 40.0, "area_thd": None})
    read_back(TypeAdapter(VariantOptions), {"specialize": ["norm", "ls"], "registers": 4})


def test_a_neuron_set_in_an_older_shape_is_read_with_that_part_as_text() -> None:
    settings = {"detect_layer": 10, "threshold": "auto", "threshold_value": 367.9, "top_k": 3,
                "selection": {"method": "an older selection"}, "source": "published list"}  # fmt: skip
    read = NeuronSetSettings.model_validate(settings)
    assert read.selection is None and read.detect_layer == 10
    assert read.other == {"selection": '{"method": "an older selection"}'}


def test_a_recipe_s_options_are_its_own_and_nothing_else() -> None:
    record = {"recipe": "supervised", "steps": 1, "batch_size": 4, "lr": 1e-3, "min_lr": 1e-6,
              "weight_decay": 0.05, "warmup_steps": 0, "clip_grad": None, "accum_steps": 1,
              "amp": "off", "seed": 0, "img_size": 32, "checkpoint_every": 1,
              "keep_checkpoints": 1, "model": {"name": "vit_tiny_patch16_224"},
              "options": {"label_smoothing": 0.1, "jitter": 0.3},
              "data": {"spec": "synthetic-cls:n=8", "n": 8, "fingerprint": None}}  # fmt: skip
    assert ResolvedTrainConfig.model_validate(record).options.label_smoothing == 0.1
    with pytest.raises(ValidationError, match="jitter"):
        ResolvedTrainConfig.model_validate({**record, "options": {"label_smoothing": 0.1}})
    assert "momentum" in DinoOptions.model_fields
