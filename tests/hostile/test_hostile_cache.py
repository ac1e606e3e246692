"""A feature-cache shard damaged on disk -- in place, at the same size, or in its header -- is
detected by its checksum, extracted again (counted in the manifest and the probe report) and
never read: the features equal those of an undamaged cache. A shard forged with a valid checksum
is checked field by field against its tensors and extracted again too; one that lacks a tensor
is a named error when that tensor is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _support.cache_worker import ToyDataset, small_vit
from _support.saved_config import SavedConfig
from vitreg.errors import VitregError
from vitreg.probe import extract
from vitreg.probe.shards import REPLACED, shard_name
from vitreg.results.schema import model_info

pytestmark = pytest.mark.usefixtures("one_thread")
VIEWS = ("cls", "patch_mean")


def flip(path: Path, offset: int) -> None:
    """Invert one byte of ``path`` in place (its size unchanged)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupted_shard_is_re_extracted_and_counted(tmp_path) -> None:
    model, data = small_vit(), ToyDataset(n=6)
    args = {"root": tmp_path, "views": VIEWS, "dtype": torch.float32, "shard_size": 3}
    clean = extract(model, data, **args)
    want = clean.get("cls", -1).clone()
    assert clean.manifest.replaced == {} and all(s.sha256 for s in clean.manifest.shards)
    shard = clean.folder / shard_name(1)
    size = shard.stat().st_size

    flip(shard, size - 5)  # a tensor byte: the file still opens, the values changed
    assert shard.stat().st_size == size
    again = extract(model, data, **args)
    assert again.forward_passes == 1  # shard 1 only (3 samples, batch 32)
    assert again.manifest.replaced == {"checksum mismatch": 1}
    assert torch.equal(again.get("cls", -1), want)

    reused = extract(model, data, **args)
    assert reused.forward_passes == 0 and reused.manifest.replaced == {}

    flip(shard, 12)  # a header byte: the file no longer opens as safetensors
    header = extract(model, data, **args)
    assert header.manifest.replaced == {"unreadable": 1}
    assert torch.equal(header.get("cls", -1), want)


def test_probe_report_names_the_re_extracted_shards(tmp_path) -> None:
    from vitreg.probe.linear import FitSettings
    from vitreg.probe.run import run
    from vitreg.report.renderers.probe import write_probe_run

    model, cache = small_vit(), tmp_path / "cache"
    data = "synthetic-cls:n=8,size=28"
    cfg = FitSettings(seeds=(0,), epochs=1)
    first = run(model, "classification", data, cache_dir=cache, config=cfg)
    flip(Path(first.results.caches["base/test"].folder) / shard_name(0), -3)
    second = run(model, "classification", data, cache_dir=cache, config=cfg)
    assert second.results.caches["base/test"].replaced == {"checksum mismatch": 1}
    assert second.results.caches["base/train"].replaced == {}
    out = tmp_path / "run"
    write_probe_run(out, second.results, model_info(second.model), SavedConfig(), "vitreg probe")
    text = (out / "report.md").read_text()
    assert "extracted again: base/test: 1 (checksum mismatch)" in text


def forge(path: Path, edit_meta=None, edit_tensors=None) -> None:
    """Rewrite shard ``path`` by hand -- metadata and tensors edited -- with a valid checksum,
    as a forger who read vitreg's source would."""
    from safetensors.torch import load_file

    from vitreg.probe.shards import shard_meta, with_checksum

    meta, tensors = shard_meta(path), load_file(str(path))
    meta.pop("sha256")
    if edit_meta:
        edit_meta(meta)
    if edit_tensors:
        edit_tensors(tensors)
    path.write_bytes(with_checksum(tensors, meta))


FORGERIES = {
    "n is not a number": ({"n": "three"}, None, "malformed metadata"),
    "n lies": ({"n": "2"}, None, "malformed metadata"),
    "start lies": ({"start": "0", "stop": "9"}, None, "malformed metadata"),
    "keys not JSON": ({"keys": "[not json"}, None, "malformed metadata"),
    "skipped wrong type": ({"skipped": '{"reason": 1}'}, None, "malformed metadata"),
    "layout counts wrong": ({"layouts": '{"x": {"n_cls": -1}}'}, None, "malformed metadata"),
    "boxes wrong": ({"boxes": '[["a"], [], []]'}, None, "malformed metadata"),
    "extra tensor, wrong rows": (None, {"extra": torch.zeros(7)}, "tensors do not match"),
    "no tensors at all": (None, "clear", "tensors do not match"),
}


@pytest.mark.parametrize("case", FORGERIES)
def test_a_forged_shard_with_a_valid_checksum_is_extracted_again(tmp_path, case) -> None:
    meta_edit, tensor_edit, reason = FORGERIES[case]
    model, data = small_vit(), ToyDataset(n=6)
    args = {"root": tmp_path, "views": VIEWS, "dtype": torch.float32, "shard_size": 3}
    want = extract(model, data, **args).get("cls", -1).clone()
    shard = next(tmp_path.glob("*/" + shard_name(1)))

    def edit_tensors(tensors: dict) -> None:
        if tensor_edit == "clear":
            tensors.clear()
        else:
            tensors.update(tensor_edit)

    forge(shard, lambda m: m.update(meta_edit or {}), edit_tensors if tensor_edit else None)
    again = extract(model, data, **args)
    assert again.manifest.replaced == {next(r for r in REPLACED if reason in r): 1}
    assert torch.equal(again.get("cls", -1), want) and again.keys == clean_keys(6)


def clean_keys(n: int) -> list[str]:
    return [f"toy/{i:04d}" for i in range(n)]


def test_a_forged_shard_missing_a_tensor_is_a_named_error_when_read(tmp_path) -> None:
    model, data = small_vit(), ToyDataset(n=6)
    args = {"root": tmp_path, "views": VIEWS, "dtype": torch.float32, "shard_size": 3}
    extract(model, data, **args)
    shard = next(tmp_path.glob("*/" + shard_name(1)))
    forge(shard, edit_tensors=lambda t: t.pop(next(k for k in t if k.endswith("/cls"))))
    again = extract(model, data, **args)
    assert again.manifest.replaced == {}  # the forger's checksum holds
    with pytest.raises(VitregError, match="damaged or was not written by vitreg.*delete that"):
        again.get("cls", -1)
    assert again.get("patch_mean", -1).shape[0] == 6  # the other views still read
