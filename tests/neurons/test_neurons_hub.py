"""Neuron sets on the hub: a hub folder round-trips (write, read back, the fix gives the same
numbers), ``hf:ORG/REPO[@REVISION]`` resolves from a pre-filled cache with HF_HUB_OFFLINE=1, and
``push`` uploads through the hub API (a fake one here: never the network)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from vitreg.errors import InputError
from vitreg.fix.neuron_set import NeuronSet, weights_fingerprint
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.neurons import hub
from vitreg.neurons.builtin import builtin_folder, builtin_neurons
from vitreg.results.fix import NeuronsUsed
from vitreg.results.neurons import HeldOut, Stability
from vitreg.testing.images import synthetic_images

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SPEC = "planted:dinov2_s14"


@pytest.fixture(scope="module")
def model() -> Any:
    from vitreg.models.load import load

    torch.manual_seed(0)
    return load(SPEC, img_size=56)


@pytest.fixture()
def neurons(model: Any) -> NeuronSet:
    truth = model.module.vitreg_planted
    ns = NeuronSet.from_pairs(truth.causal_units, model)
    ns.fingerprint = weights_fingerprint(model.module)
    ns.model_spec = SPEC
    return ns


def metadata(ns: NeuronSet) -> hub.CardMetadata:
    held = HeldOut(
        n_images=4, k=3, outlier_rate_before=0.05, max_patch_norm_before=80.0,
        median_patch_norm_before=10.0, max_over_median_before=8.0,
        blocks_with_outlier_mode_before=[6, 7], outlier_rate_after=0.0,
        max_patch_norm_after=12.0, median_patch_norm_after=10.0, max_over_median_after=1.2,
        blocks_with_outlier_mode_after=[], ordinary_max_over_median=1.3,
    )  # fmt: skip
    stab = Stability(
        method="halves", halves=[[[6, 5]], [[6, 5]]], overlap_between_halves=1.0,
        overlap_with_whole=[1.0, 1.0],
    )  # fmt: skip
    return hub.card_metadata(
        ns, resolutions=[[56, 56]], images="synthetic", n_images=16, held_out=held,
        status="clean", stability=stab,
    )  # fmt: skip


def fixed_output(model: Any, ns: NeuronSet) -> torch.Tensor:
    x = synthetic_images(2, 56, seed=5)
    with TestTimeRegisters(ns).applied(model), torch.no_grad():
        return model.features(x)


def fill_cache(cache: Path, repo: str, folder: Path) -> Path:
    """The layout ``huggingface_hub`` keeps for a downloaded repository at ``main``."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name in hub.FILES:
        shutil.copy(folder / name, snap / name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return snap


@pytest.fixture()
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants as c

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # were it online: refused at once
    return cache


def test_the_card_metadata_is_typed_and_names_a_hub_base_only_where_there_is_one(
    neurons: NeuronSet,
) -> None:
    meta = metadata(neurons)
    assert isinstance(meta, hub.CardMetadata) and isinstance(meta.vitreg, hub.CardInfo)
    assert meta.vitreg.held_out["status"] == "clean" and meta.vitreg.held_out["k"] == 3
    assert meta.vitreg.stability is not None and meta.vitreg.stability.method == "halves"
    assert "base_model" not in meta.model_dump()  # a local spec has no hub repository
    on_hub = copy.copy(neurons)
    on_hub.model_spec = "timm:vit_small_patch14_dinov2.lvd142m"
    dumped = metadata(on_hub).model_dump()
    assert list(dumped) == ["license", "library_name", "tags", "vitreg", "base_model"]
    assert dumped["base_model"] == "timm/vit_small_patch14_dinov2.lvd142m"


def test_hub_folder_round_trips_and_fixes_the_same(
    tmp_path: Path, model: Any, neurons: NeuronSet
) -> None:
    folder = hub.write_folder(neurons, tmp_path / "set", metadata(neurons))
    assert sorted(p.name for p in folder.iterdir()) == sorted(hub.FILES)
    back = hub.read_folder(folder)
    assert back.model_dump() == neurons.model_dump()
    assert torch.equal(fixed_output(model, back), fixed_output(model, neurons))
    meta = hub.read_metadata(folder)
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "vitreg"
    v = meta["vitreg"]
    assert v["base_model_spec"] == SPEC and v["n_neurons"] == len(neurons)
    assert v["resolutions"] == [[56, 56]] and v["n_images"] == 16
    assert v["held_out"]["status"] == "clean" and v["stability"]["overlap_between_halves"] == 1.0
    assert v["weights_fingerprint"] == neurons.fingerprint
    card = (folder / hub.CARD).read_text()
    assert "5.00% before, 0.00% after" in card and "overlap by 100%" in card


def test_an_edited_folder_is_refused(tmp_path: Path, neurons: NeuronSet) -> None:
    folder = hub.write_folder(neurons, tmp_path / "set", metadata(neurons))
    neurons.top(1).save(folder / hub.SET_NAME)  # the card still says the whole set
    with pytest.raises(InputError, match="n_neurons"):
        hub.read_folder(folder)


def test_offline_cache_resolves_names_and_revisions(
    tmp_path: Path, offline_cache: Path, neurons: NeuronSet
) -> None:
    folder = hub.write_folder(neurons, tmp_path / "set", metadata(neurons))
    fill_cache(offline_cache, "org/planted-neurons", folder)
    for ref in ("hf:org/planted-neurons", f"hf:org/planted-neurons@{COMMIT}"):
        got = hub.load_hub(ref)
        assert got.pairs() == neurons.pairs() and got.fingerprint == neurons.fingerprint
        assert got.data["hub"]["commit"] == COMMIT
    assert hub.load_hub("hf:org/planted-neurons@main").data["hub"]["revision"] == "main"
    with pytest.raises(InputError, match="not in the local hub cache"):
        hub.load_hub("hf:org/other")
    with pytest.raises(InputError, match="not in the local hub cache"):
        hub.load_hub("hf:org/planted-neurons@v2")


def test_verbs_take_hub_sets_with_the_fingerprint_check(
    tmp_path: Path, offline_cache: Path, model: Any, neurons: NeuronSet
) -> None:
    from vitreg.progress import SILENT
    from vitreg.verbs.neuron_sources import load_neurons, neuron_file
    from vitreg.verbs.result import Notices

    folder = hub.write_folder(neurons, tmp_path / "set", metadata(neurons))
    fill_cache(offline_cache, "org/planted-neurons", folder)
    ref = "hf:org/planted-neurons"
    pre = neuron_file(ref, SPEC)
    notices = Notices(None)
    chosen, info, _ = load_neurons(model, SPEC, ref, None, None, SILENT, notices, pre)
    assert chosen.pairs() == neurons.pairs()
    assert isinstance(info, NeuronsUsed) and info.source == f"the hub set {ref} (commit {COMMIT})"
    assert info.fingerprint_matches is True and not notices.items


@pytest.mark.parametrize(
    "ref", ["hf:org", "hf:org/repo@", "hf:../x/y", "hf:org/re po", "org/a/b", "hf:"]
)
def test_bad_refs_are_clear_errors(ref: str) -> None:
    with pytest.raises(InputError, match="names no hub neuron set"):
        hub.parse_ref(ref)


class FakeApi:
    """Records the calls ``push`` makes; ``fail`` makes the upload fail as a lost connection."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def create_repo(self, repo_id: str, **kw: Any) -> None:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kw}))

    def upload_folder(self, **kw: Any) -> Any:
        if self.fail:
            raise ConnectionError("the hub cannot be reached")
        self.calls.append(("upload_folder", kw))
        return type("Info", (), {"commit_url": "https://hub.example/org/r/commit/1"})()


def test_push_uploads_the_folder_through_the_api(tmp_path: Path, neurons: NeuronSet) -> None:
    folder = hub.write_folder(neurons, tmp_path / "set", metadata(neurons))
    (folder / "notes.txt").write_text("not uploaded")
    api = FakeApi()
    url = hub.push(folder, "org/planted-neurons", api=api, private=True)
    assert url.endswith("/commit/1")
    (kind, made), (kind2, up) = api.calls
    assert (kind, kind2) == ("create_repo", "upload_folder")
    assert made == {"repo_id": "org/planted-neurons", "private": True, "exist_ok": True}
    assert up["repo_id"] == "org/planted-neurons" and up["folder_path"] == str(folder)
    assert up["allow_patterns"] == hub.FILES and "3 neurons" in up["commit_message"]
    with pytest.raises(InputError, match="HF_TOKEN"):
        hub.push(folder, "org/planted-neurons", api=FakeApi(fail=True))
    with pytest.raises(InputError, match="not a hub folder"):
        hub.push(tmp_path / "missing", "org/x", api=FakeApi())
    (folder / hub.CARD).unlink()
    with pytest.raises(InputError, match="no model card"):
        hub.push(folder, "org/x", api=FakeApi())


def test_push_names_a_failing_disk_apart_from_a_failing_upload(
    tmp_path: Path, neurons: NeuronSet
) -> None:
    import errno

    from vitreg.errors import WriteError

    folder = hub.write_folder(neurons, tmp_path / "set", metadata(neurons))

    class FullDisk(FakeApi):
        def upload_folder(self, **kw: Any) -> Any:
            raise OSError(errno.ENOSPC, "No space left on device", "/cache/xet/chunk")

    with pytest.raises(WriteError, match="'/cache/xet/chunk': the disk is full .* free"):
        hub.push(folder, "org/planted-neurons", api=FullDisk())


def test_push_command_reports_the_commit(
    tmp_path: Path, neurons: NeuronSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    from vitreg.cli.app import app

    folder = hub.write_folder(neurons, tmp_path / "set", metadata(neurons))
    api = FakeApi()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: api)
    result = CliRunner().invoke(app, ["push", str(folder), "org/planted-neurons"])
    assert result.exit_code == 0, result.output
    assert "/commit/1" in result.output and "hf:org/planted-neurons" in result.output
    bad = CliRunner().invoke(app, ["push", str(folder), "org/x@v1"])
    assert bad.exit_code == 2 and "--revision" in bad.output


def test_the_builtin_set_is_a_hub_folder() -> None:
    spec = "timm:vit_large_patch14_dinov2.lvd142m"
    meta = hub.read_metadata(builtin_folder(spec))
    assert meta["base_model"] == "timm/vit_large_patch14_dinov2.lvd142m"
    assert meta["vitreg"]["base_model_spec"] == spec and meta["vitreg"]["n_neurons"] == 45
    assert "test-time-registers" in meta["vitreg"]["origin"]
    assert len(builtin_neurons(spec)) == 45


@pytest.mark.slow
def test_cli_hub_dir_then_fix_from_the_hub_equals_the_file(
    tmp_path: Path, offline_cache: Path
) -> None:
    import json

    from vitreg.cli.app import app

    runner = CliRunner()
    args = [SPEC, "--img-size", "112", "--limit", "16"]
    found = runner.invoke(
        app, ["neurons", *args, "--out", str(tmp_path / "n"), "--hub-dir", str(tmp_path / "h")]
    )
    assert found.exit_code == 0, found.output
    meta = hub.read_metadata(tmp_path / "h")["vitreg"]
    run = json.loads((tmp_path / "n" / "metrics.json").read_text())
    assert meta["n_images"] == 16 and meta["resolutions"] == [[112, 112]]
    assert meta["held_out"]["status"] == run["results"]["status"]
    assert meta["n_neurons"] == run["results"]["n_neurons"]
    fill_cache(offline_cache, "org/planted-neurons", tmp_path / "h")
    outs = {}
    for name, neurons in (
        ("file", str(tmp_path / "n" / "neurons.json")),
        ("hub", "hf:org/planted-neurons"),
    ):
        out = tmp_path / f"fix-{name}"
        res = runner.invoke(app, ["fix", *args, "--neurons", neurons, "--out", str(out)])
        assert res.exit_code == 0, res.output
        outs[name] = json.loads((out / "metrics.json").read_text())["results"]
    hub_info = outs["hub"].pop("neurons")
    assert outs["file"].pop("neurons")["source"] != hub_info["source"]
    assert hub_info["fingerprint_matches"] is True and COMMIT in hub_info["source"]
    assert outs["file"] == outs["hub"]
