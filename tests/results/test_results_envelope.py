"""The envelope's blocks are typed where they are made: the model block and the data block come
out of ``model_info`` / ``data_info`` as the models metrics.json holds, and a headline is a
:class:`Metric` read from the results it repeats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitreg.report.document import Headline, build_document, headline_values
from vitreg.results.schema import (
    DataInfo,
    Metric,
    ModelDescription,
    ModelInfo,
    data_info,
    is_synthetic,
    model_info,
)

GOLDEN = Path(__file__).parents[1] / "report" / "_golden"
DESCRIBED = {
    "spec": "planted:vit_tiny_patch16_224",
    "family": "vit",
    "class": "VisionTransformer",
    "layout": {"n_cls": 1, "n_registers": 0},
    "n_layers": 12,
    "d_model": 192,
    "d_mlp": 768,
    "n_heads": 3,
    "n_params": 5_000_000,
    "notes": [],
    "pos_embed": "learned",  # a key the block does not name: kept after the named ones
}


def test_model_info_is_the_typed_model_block():
    described = ModelDescription.model_validate(DESCRIBED)
    assert described.class_name == "VisionTransformer" and is_synthetic(described)
    info = model_info(described)
    assert isinstance(info, ModelInfo)
    assert info.synthetic and info.class_name == "VisionTransformer"
    assert info.dims == {"n_layers": 12, "d_model": 192, "d_mlp": 768, "n_heads": 3,
                         "n_params": 5_000_000}  # fmt: skip
    dumped = info.model_dump(mode="json")
    assert list(dumped)[-1] == "pos_embed" and dumped["pos_embed"] == "learned"


def test_data_info_is_the_typed_data_block_with_the_rest_after_it():
    info = data_info({"source": "folder:x", "n_images": 3, "skipped": {"a.txt": "not an image"},
                      "fingerprint": "abc"})  # fmt: skip
    assert isinstance(info, DataInfo)
    assert (info.description, info.n_images, info.skipped) == ("folder:x", 3,
                                                               {"a.txt": "not an image"})  # fmt: skip
    dumped = info.model_dump(mode="json")
    assert list(dumped) == ["description", "n_images", "skipped", "converted", "source",
                            "fingerprint"]  # fmt: skip


def test_a_headline_is_a_metric_read_from_the_results():
    mean = Headline("mean_loss", "/results/losses/*/value", False, "mean", aggregate="mean")
    metric = mean.metric({"losses": [{"value": 1.0}, {"value": 3.0}]})
    assert isinstance(metric, Metric)
    assert (metric.value, metric.source, metric.aggregate) == (2.0, mean.pointer, "mean")
    assert headline_values({"losses": [{"value": 2.0}]}, [mean]) == {"mean_loss": 2.0}
    with pytest.raises(ValueError, match="does not resolve"):
        Headline("x", "/results/missing", True).metric({})


def test_build_document_takes_the_typed_blocks_as_they_are():
    golden = json.loads((GOLDEN / "train" / "metrics.json").read_text())
    model, data = ModelInfo(**golden["model"]), DataInfo(**golden["data"])
    marks = [Headline(m["name"], m["source"], m["higher_is_better"], m["description"],
                      m.get("unit"), m.get("layer"), m.get("aggregate"))
             for m in golden["metrics"]]  # fmt: skip
    doc = build_document("train", golden["results"], marks, command=golden["command"],
                         described=model, data=data, config=golden["config"])  # fmt: skip
    assert doc.model is model and doc.data is data
    assert all(isinstance(m, Metric) for m in doc.metrics)
    again = doc.model_dump(mode="json")
    for key in ("model", "data", "config", "results", "metrics"):
        assert json.dumps(again[key]) == json.dumps(golden[key])


def test_a_model_describes_itself_typed_in_the_order_its_files_hold():
    import vitreg

    model = vitreg.load("timm:vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2)
    described = model.describe()
    assert isinstance(described, ModelDescription)
    assert (described.n_layers, described.supports_insertion) == (2, True)
    assert list(described.model_dump(by_alias=True)) == [
        "spec", "weights", "family", "source", "class", "n_layers", "d_model", "d_mlp",
        "n_heads", "n_params", "image_size", "layout", "attention", "supports_insertion", "notes",
    ]  # fmt: skip
    info = model_info(described, vlm={"class": "Llava"})
    assert (
        not info.synthetic
        and info.dims["n_layers"] == 2
        and info.class_name == described.class_name
    )
    assert list(info.model_dump())[-2:] == ["supports_insertion", "vlm"]


def test_the_mapping_forms_of_a_description_still_work_with_a_warning():
    described = ModelDescription.model_validate(DESCRIBED)
    with pytest.warns(DeprecationWarning, match="describe\\(\\).spec"):
        assert described["class"] == "VisionTransformer"
    with pytest.warns(DeprecationWarning, match="rather than a mapping"):
        assert model_info(DESCRIBED) == model_info(described)  # a mapping, as describe() gave
    with pytest.warns(DeprecationWarning, match="rather than a mapping"):
        assert is_synthetic({"spec": "planted:clip_t16"})
