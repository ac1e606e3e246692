"""Feature cache: views match a direct run, reuse without forward passes, resume after a kill,
keys, test-time registers, hierarchical models, torchrun."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import vitreg
from _support.cache_worker import ToyDataset, small_vit
from conftest import HANG_GUARD_S, TESTS, free_port
from vitreg.data.transforms import prepare
from vitreg.errors import InputError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.probe import CachedFeatures, extract

WORKER = TESTS / "_support" / "cache_worker.py"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ALL_VIEWS = ("cls", "reg", "extra", "patch_mean", "patch_center", "patch_top", "patches")


@pytest.fixture(scope="module")
def vit() -> vitreg.Model:
    return small_vit()


def inputs(data: ToyDataset, size: int) -> tuple[torch.Tensor, list[int]]:
    """The prepared images of the usable samples, and their indices."""
    kept = [i for i in range(len(data)) if i not in data.bad]
    return torch.stack([prepare(data[i], size, MEAN, STD)["image"] for i in kept]), kept


def test_views_equal_a_direct_run_with_cache(vit, tmp_path):
    data = ToyDataset(n=7, bad=(2,))
    feats = extract(
        vit, data, root=tmp_path, layers=(0, -1, "final"), views=ALL_VIEWS,
        dtype=torch.float32, pixels=True, batch_size=3, shard_size=4,
    )  # fmt: skip
    x, kept = inputs(data, 28)
    names = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "ln_final.hook_out"]
    _, direct = vit.run_with_cache(x, names=names)
    for request, name in zip((0, -1, "final"), names, strict=True):
        t = direct[name]  # 1 cls + 4 registers + 2x2 patches, written out by hand
        patches, norms = t[:, 5:], t[:, 5:].norm(dim=-1)
        top = norms.argmax(1)
        want = {
            "cls": t[:, 0],
            "reg": t[:, 1:5],
            "patch_mean": patches.mean(1),
            "patch_center": patches[:, 3],
            "patch_top": patches[torch.arange(len(kept)), top],
            "patches": patches,
            "patch_norms": norms,
        }
        for view, expected in want.items():
            torch.testing.assert_close(feats.get(view, request), expected, atol=1e-5, rtol=1e-5)
            assert torch.equal(feats.get(view, name), feats.get(view, request))
        assert torch.equal(feats.get("patch_top_index", name), top)
    unfolded = F.unfold(x, kernel_size=14, stride=14).reshape(len(kept), 3, 14, 14, 4)
    torch.testing.assert_close(
        feats.get("pixels", 0), unfolded.permute(0, 4, 2, 3, 1).reshape(len(kept), 4, -1)
    )
    assert feats.n == len(kept) and feats.keys == [f"toy/{i:04d}" for i in kept]
    assert feats.targets("label").tolist() == [i % 3 for i in kept]
    masks = torch.stack([torch.as_tensor(prepare(data[i], 28, MEAN, STD)["mask"]) for i in kept])
    assert torch.equal(feats.targets("mask"), masks.long()) and masks.shape[1:] == (28, 28)
    assert len(feats.targets("boxes")) == len(kept)
    assert feats.manifest.n_skipped == 1 and feats.manifest.skipped == {"unreadable_image": 1}
    assert feats.manifest.absent[names[0]] == {"extra": feats.manifest.absent[names[0]]["extra"]}
    with pytest.raises(InputError, match="extra"):
        feats.get("extra", 0)
    assert feats.layout[names[0]].n_reg == 4 and feats.forward_passes == 2  # one batch per shard


def test_second_run_does_no_forward_pass_and_returns_identical_tensors(vit, tmp_path):
    data = ToyDataset(n=5)
    seen: list[int] = []
    first = extract(vit, data, root=tmp_path, shard_size=2, batch_size=2, progress=seen.append)
    files = sorted(first.folder.glob("shard-*.safetensors"))
    stamps = [f.stat().st_mtime_ns for f in files]
    second = extract(vit, data, root=tmp_path, shard_size=2, batch_size=2, progress=seen.append)
    assert seen == [2, 4, 5]  # samples done after each batch; nothing on the reuse
    assert first.forward_passes == 3 and second.forward_passes == 0
    assert second.folder == first.folder and len(files) == 3
    assert [f.stat().st_mtime_ns for f in files] == stamps
    for view in ("cls", "reg", "patch_mean"):
        assert torch.equal(first.get(view), second.get(view))
    assert CachedFeatures(first.folder).manifest == second.manifest


def wait_for(pattern: str, folder: Path, proc: subprocess.Popen) -> None:
    """Wait until the worker has written a file matching ``pattern`` (it stalls after 3 shards)."""
    while not list(folder.glob(f"*/{pattern}")):
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)


@pytest.mark.slow
def test_killed_writer_resumes_to_the_uninterrupted_result(vit, tmp_path):
    root = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(root), "slow"], stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for("shard-00002.safetensors", root, proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (folder,) = root.iterdir()
    done = len(list(folder.glob("shard-*.safetensors")))
    assert done == 3 and not (folder / "manifest.json").exists()
    (folder / "shard-00019.safetensors").write_bytes(b"\x10\x00 half a shard")  # damaged file
    (folder / ".shard-00018.safetensors.x1.tmp").write_bytes(b"left by a killed writer")
    kw = dict(views=("cls", "patches"), shard_size=2, batch_size=2)
    resumed = extract(vit, ToyDataset(n=40), root=root, **kw)
    whole = extract(vit, ToyDataset(n=40), root=tmp_path / "whole", **kw)
    assert resumed.folder.name == whole.folder.name == folder.name
    assert resumed.forward_passes == 20 - done and whole.forward_passes == 20
    assert not list(folder.glob("*.tmp"))
    for view in ("cls", "patches"):
        torch.testing.assert_close(resumed.get(view), whole.get(view), atol=1e-3, rtol=0)
    assert resumed.n == 40 and resumed.keys == whole.keys


def test_the_key_changes_with_fix_layers_views_and_neurons(vit, tmp_path):
    data = ToyDataset(n=2)

    def key(**kw) -> str:
        return extract(vit, data, root=tmp_path, **kw).folder.name

    ttr = TestTimeRegisters(NeuronSet([0, 0], [5, 10], [1.0, 1.0]))
    other = TestTimeRegisters(NeuronSet([0, 0], [5, 11], [1.0, 1.0]))
    keys = [
        key(),
        key(layers=(0,)),
        key(views=("cls",)),
        key(fix=ttr),
        key(fix=other),
        key(dtype=torch.float32),
        key(pixels=True),
    ]
    assert len(set(keys)) == len(keys) and key() == keys[0]


def test_test_time_registers_give_the_extra_view(vit, tmp_path):
    data = ToyDataset(n=4)
    ttr = TestTimeRegisters(NeuronSet([0, 0], [5, 10], [1.0, 1.0]), n_registers=2)
    feats = extract(vit, data, root=tmp_path, fix=ttr, views=ALL_VIEWS, dtype=torch.float32)
    assert vit.layout.n_extra == 0  # the fix is removed afterwards
    x, _ = inputs(data, 28)
    with ttr.applied(vit):
        _, direct = vit.run_with_cache(x, names="blocks.1.hook_resid_post")
    t = direct["blocks.1.hook_resid_post"]  # 1 cls + 4 registers + 2 extra + 4 patches
    torch.testing.assert_close(feats.get("extra"), t[:, 5:7], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(feats.get("reg"), t[:, 1:5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(feats.get("patch_mean"), t[:, 7:].mean(1), atol=1e-5, rtol=1e-5)
    assert feats.manifest.absent["blocks.1.hook_resid_post"] == {}
    assert feats.layout["blocks.1.hook_resid_post"].n_extra == 2
    assert feats.manifest.fix.neurons == [[0, 5], [0, 10]]


def test_swin_stages_work_without_cls(tmp_path):
    torch.manual_seed(0)
    swin = vitreg.load(
        "timm:swin_tiny_patch4_window7_224",
        pretrained=False, img_size=56, depths=(2, 2, 2, 2), embed_dim=48,
    )  # fmt: skip
    data = ToyDataset(n=3, size=64)
    views = ("cls", "patch_mean", "patch_top")
    feats = extract(swin, data, root=tmp_path, layers=(1, -1), views=views, dtype=torch.float32)
    x, _ = inputs(data, 56)
    names = ["stages.0.blocks.1.hook_resid_post", "stages.3.blocks.1.hook_resid_post"]
    _, direct = swin.run_with_cache(x, names=names)
    for name, grid in zip(names, (14, 2), strict=True):
        t = direct[name]  # a prefix-free [B, h, w, C] grid
        assert t.shape[1:3] == (grid, grid)
        flat = t.reshape(3, grid * grid, -1)
        torch.testing.assert_close(
            feats.get("patch_mean", name), flat.mean(1), atol=1e-5, rtol=1e-5
        )
        top = flat.norm(dim=-1).argmax(1)
        assert torch.equal(feats.get("patch_top_index", name), top)
        assert "cls" in feats.manifest.absent[name]
        assert feats.layout[name].grid == (grid, grid)
    with pytest.raises(InputError, match="CLS"):
        feats.get("cls", 1)
    with pytest.raises(InputError, match="none of the views"):
        extract(swin, data, root=tmp_path, views=("cls",))


def test_bad_requests_name_the_fix(vit, tmp_path):
    data = ToyDataset(n=2)
    with pytest.raises(InputError, match="out of range"):
        extract(vit, data, root=tmp_path, layers=(5,))
    with pytest.raises(InputError, match="choose from"):
        extract(vit, data, root=tmp_path, views=("cls", "mean"))
    with pytest.raises(vitreg.VitregError, match="did you mean"):
        extract(vit, data, root=tmp_path, layers=("blocks.0.hook_resid_pots",))
    feats = extract(vit, data, root=tmp_path, views=("cls",))
    with pytest.raises(InputError, match="not cached"):
        feats.get("cls", 0)
    with pytest.raises(InputError, match="not extracted"):
        feats.get("patch_mean")
    with pytest.raises(InputError, match="pixels=True"):
        feats.get("pixels")


@pytest.mark.slow
def test_torchrun_two_ranks_equal_one_process(vit, tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        f"--master_port={free_port()}", str(WORKER), str(tmp_path / "dist"), "dist",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "rank 0 forward_passes 3" in run.stdout and "rank 1 forward_passes 2" in run.stdout
    kw = dict(shard_size=2, batch_size=2)
    single = extract(vit, ToyDataset(n=9, bad=(4,)), root=tmp_path / "single", **kw)
    (folder,) = (tmp_path / "dist").iterdir()
    dist = CachedFeatures(folder)
    assert folder.name == single.folder.name and single.forward_passes == 5
    assert dist.manifest.written() == json.loads((single.folder / "manifest.json").read_text())
    assert dist.n == 8 and dist.keys == single.keys
    for view in ("cls", "reg", "patch_mean"):
        torch.testing.assert_close(dist.get(view), single.get(view), atol=1e-3, rtol=0)


def test_the_key_and_manifest_of_a_known_cache_stay_the_same(vit, tmp_path):
    """Old caches are found again: the folder name (the identity's hash) and the manifest's
    bytes (shard list aside) of a known extraction, pinned as vitreg wrote them."""
    ttr = TestTimeRegisters(NeuronSet([0, 0], [5, 10], [1.0, 1.0]), n_registers=2)
    pinned = {
        None: ("26155ae55b5a239c", "a9906a2b6ef627f6"),
        ttr: ("c7581367a86285de", "fbafa6602ca74f57"),
    }
    for fix, (key, manifest) in pinned.items():
        feats = extract(vit, ToyDataset(n=2), root=tmp_path, fix=fix, views=("cls", "patch_mean"))
        written = json.loads((feats.folder / "manifest.json").read_text(encoding="utf-8"))
        written.pop("shards")
        text = json.dumps(written, indent=2).encode()
        assert (feats.folder.name, hashlib.sha256(text).hexdigest()[:16]) == (key, manifest)


def test_the_identity_and_manifest_are_typed_and_list_shards_in_file_order(vit, tmp_path):
    from vitreg.probe.cache import (
        CacheIdentity,
        CacheManifest,
        cache_identity,
        make_plan,
        write_manifest,
    )

    data = ToyDataset(n=3, bad=(1,))
    feats = extract(vit, data, root=tmp_path, views=("cls",))
    plan = make_plan(vit, (-1,), ("cls",))
    identity = cache_identity(vit, data, plan, None, torch.float16, False, 256)
    assert isinstance(identity, CacheIdentity) and identity.model.n_layers == 2
    manifest = write_manifest(feats.folder, identity, plan, feats.folder.name, 1)
    assert isinstance(manifest, CacheManifest) and manifest.shards[0].skipped[0].index == 1
    shard = json.loads((feats.folder / "manifest.json").read_text(encoding="utf-8"))["shards"][0]
    assert list(shard) == ["file", "start", "stop", "n", "skipped", "sha256"]
    assert shard["skipped"] == [{"index": 1, "key": "toy/0001", "reason": "unreadable_image"}]


def test_the_manifest_is_read_back_as_the_model_it_was_written_from(vit, tmp_path):
    """One shape: ``CachedFeatures.manifest`` is the ``CacheManifest`` the writer dumped (the
    fix's flat block too); a cache written before shards were hashed and repairs counted still
    reads; a damaged manifest is a named error; a key read still works, with a warning."""
    from vitreg.errors import VitregError
    from vitreg.probe.cache_files import CacheManifest

    ttr = TestTimeRegisters(NeuronSet([0, 0], [5, 10], [1.0, 1.0]), n_registers=2)
    feats = extract(vit, ToyDataset(n=3), root=tmp_path, fix=ttr, views=("cls", "patch_mean"))
    path = feats.folder / "manifest.json"
    written = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(feats.manifest, CacheManifest) and feats.manifest.n == 3
    assert feats.manifest.fix is not None and feats.manifest.fix.neurons == [[0, 5], [0, 10]]
    assert feats.manifest.written() == written  # read back, it dumps to the same file
    with pytest.warns(DeprecationWarning, match="manifest.n"):
        assert feats.manifest["n"] == 3

    older = {k: v for k, v in written.items() if k not in ("repairs", "replaced")}
    older["shards"] = [{k: v for k, v in s.items() if k != "sha256"} for s in written["shards"]]
    path.write_text(json.dumps(older), encoding="utf-8")
    again = CachedFeatures(feats.folder)
    assert again.manifest.replaced == {} and again.manifest.shards[0].sha256 is None
    assert torch.equal(again.get("cls"), feats.get("cls"))

    path.write_text(json.dumps({**written, "n": "three"}), encoding="utf-8")
    with pytest.raises(VitregError, match=r"manifest.*damaged \(n: "):
        CachedFeatures(feats.folder)
