"""Hostile input: every bad image, folder entry or data file is a named error or a counted skip.

Every case is generated here (PIL, numpy, os.mkfifo, os.symlink); no binary fixture is committed.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from typer.testing import CliRunner

import vitreg
from _support.saved_config import SavedConfig
from vitreg.cli.app import app
from vitreg.data.datasets import (
    BaseDataset,
    DataWarning,
    Sample,
    SkipSample,
    iter_samples,
    open_dataset,
)
from vitreg.data.folder import (
    MAX_PIXELS,
    FolderLog,
    PixelBudgetError,
    iter_folder,
    list_images,
    load_image,
    walk_folder,
)
from vitreg.errors import InputError
from vitreg.probe.linear import FitSettings
from vitreg.probe.run import run as probe_run
from vitreg.report.renderers.probe import write_probe_run
from vitreg.results.schema import DataInfo, model_info
from vitreg.testing.images import synthetic_pil
from vitreg.train.data import describe_training_data, open_data

needs_posix = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and symlinks: POSIX")
CFG = FitSettings(seeds=(0,), epochs=2)


def to_tensor(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img.resize((8, 8)), dtype=np.float32)).permute(2, 0, 1)


def declared_png(path: Path, width: int, height: int) -> Path:
    """A tiny valid PNG whose IHDR is patched to declare ``width x height`` (CRC fixed): the
    file is a few dozen bytes, the image it declares is huge."""
    Image.new("L", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    return path


def good(folder: Path, n: int, size: int = 112) -> list[Path]:
    paths = []
    for i, img in enumerate(synthetic_pil(n, size, seed=7, flat_fraction=0.1)):
        paths.append(folder / f"good_{i}.png")
        img.save(paths[-1])
    return paths


def names(mapping: dict[str, str]) -> dict[str, str]:
    return {Path(k).name: v for k, v in mapping.items()}


# ------------------------------------------------------------------ pixel budget
def test_a_bomb_is_skipped_from_its_header_without_any_pillow_warning(tmp_path: Path) -> None:
    bomb = declared_png(tmp_path / "bomb.png", 20000, 20000)
    assert bomb.stat().st_size < 100
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a DecompressionBombWarning would fail the test
        with pytest.raises(PixelBudgetError, match="declares 20000×20000 = 400,000,000 pix"):
            load_image(bomb)
        big = declared_png(tmp_path / "big.png", 10000, 10000)  # Pillow only warns on this one
        with pytest.raises(PixelBudgetError, match="above the budget of 50,000,000"):
            load_image(big)
    # a budget above Pillow's own limit: the bomb is still refused, and the reason says by whom
    with pytest.raises(PixelBudgetError, match="Pillow's decompression-bomb limit"):
        load_image(bomb, max_pixels=10**9)
    assert Image.MAX_IMAGE_PIXELS == int(1024 * 1024 * 1024 // 4 // 3)  # Pillow's global intact


def test_an_image_over_a_lowered_budget_is_skipped_and_one_within_it_used(tmp_path: Path) -> None:
    declared_png(tmp_path / "a_9000.png", 9000, 9000)
    Image.new("RGB", (40, 30), (10, 200, 30)).save(tmp_path / "b_small.png")
    log = FolderLog()
    batches = list(iter_folder(tmp_path, to_tensor, log=log, max_pixels=2_000_000))
    assert sum(b.shape[0] for b in batches) == 1
    assert names(log.skipped) == {
        "a_9000.png": "declares 9000×9000 = 81,000,000 pixels, above the budget of 2,000,000"
    }
    with pytest.raises(InputError, match="no readable image.*40×30 = 1,200 pixels, above the"):
        list(iter_folder(tmp_path, to_tensor, max_pixels=1000))
    assert MAX_PIXELS == 50_000_000


# ------------------------------------------------------------------ modes
def float_tiff(path: Path, values: np.ndarray) -> Path:
    img = Image.fromarray(values.astype(np.float32))
    assert img.mode == "F"
    img.save(path)
    return path


def int_tiff(path: Path, values: np.ndarray) -> Path:
    img = Image.fromarray(values.astype(np.int32))
    assert img.mode == "I"
    img.save(path)
    return path


def ramp(lo: float, hi: float) -> np.ndarray:
    """4 x 4: lo in the first pixel, hi in the last, (lo + hi) / 2 in the second."""
    arr = np.full((4, 4), lo, np.float64)
    arr[0, 1] = (lo + hi) / 2
    arr[-1, -1] = hi
    return arr


@pytest.mark.parametrize(
    ("kind", "lo", "hi", "note"),
    [
        ("F", 0.0, 1.0, "F, values 0..1 scaled 0..1 -> 0..255"),
        ("F", -1.0, 3.0, "F, values -1..3 scaled -1..3 -> 0..255"),
        ("F", 0.0, 200.0, "F, values 0..200 scaled 0..255 -> 0..255"),
        ("I", 0, 1_000_000, "I, values 0..1000000 scaled 0..1000000 -> 0..255"),
        ("I", 0, 60_000, "I, values 0..60000 scaled 0..65535 -> 0..255"),
        ("I", -70_000, 70_000, "I, values -70000..70000 scaled -70000..70000 -> 0..255"),
    ],
)
def test_float_and_int32_tiffs_are_scaled_by_their_range(tmp_path, kind, lo, hi, note) -> None:
    arr = ramp(lo, hi)
    path = (float_tiff if kind == "F" else int_tiff)(tmp_path / "x.tif", arr)
    img, converted = load_image(path)
    assert converted == note
    r0, r1 = (float(v) for v in note.split("scaled ")[1].split(" ->")[0].split(".."))
    pixels = np.asarray(img)[..., 0].astype(float)
    expected = np.clip(np.floor((arr - r0) / (r1 - r0) * 255 + 0.5), 0, 255)
    assert np.abs(pixels - expected).max() <= 1  # (float32 arithmetic: ties may round down)
    assert pixels.max() > pixels.min()  # never all black or all white
    if (r0, r1) == (lo, hi):  # scaled by its own range: the extremes reach black and white
        assert (pixels.min(), pixels.max()) == (0, 255)


def test_nan_and_constant_floats_are_skipped_with_a_reason(tmp_path: Path) -> None:
    nan = ramp(0.0, 1.0)
    nan[1, 1] = np.nan
    float_tiff(tmp_path / "a_nan.tif", nan)
    float_tiff(tmp_path / "b_const.tif", np.full((4, 4), 1e6))
    int_tiff(tmp_path / "c_const.tif", np.full((4, 4), 100_000))
    float_tiff(tmp_path / "d_ok.tif", ramp(0.0, 1.0))
    log = FolderLog()
    assert sum(b.shape[0] for b in iter_folder(tmp_path, to_tensor, log=log)) == 1
    skipped = names(log.skipped)
    assert skipped["a_nan.tif"] == "F image with 1 NaN/infinite pixels of 16"
    assert skipped["b_const.tif"] == "F image is constant (1000000): no range to scale to 8 bits"
    assert skipped["c_const.tif"] == "I image is constant (100000): no range to scale to 8 bits"
    assert names(log.converted) == {"d_ok.tif": "F, values 0..1 scaled 0..1 -> 0..255"}


# ------------------------------------------------------------------ the walk
def hostile_entries(folder: Path) -> dict[str, str]:
    """Every entry a walk must list without reading, and a word its reason must contain."""
    os.mkfifo(folder / "fifo.png")  # opening this would block the reader forever
    os.symlink(folder / "gone.png", folder / "dangling.png")
    os.symlink(folder / "loop_b.png", folder / "loop_a.png")
    os.symlink(folder / "loop_a.png", folder / "loop_b.png")
    os.symlink("/dev/null", folder / "device.png")
    (folder / ".hidden.png").write_bytes(b"not looked at")
    (folder / ".cache").mkdir()
    Image.new("RGB", (8, 8)).save(folder / ".cache" / "inside.png")  # never listed alone
    (folder / "sub").mkdir()
    os.symlink(folder / "sub", folder / "sub_link")
    return {
        "fifo.png": "FIFO",
        "dangling.png": "dangling symlink",
        "loop_a.png": "symlink loop",
        "loop_b.png": "symlink loop",
        "device.png": "outside the folder",  # a link out of the folder is never followed
        ".hidden.png": "hidden file",
        ".cache": "hidden folder",
        "sub_link": "symlink to the folder",
    }


@needs_posix
def test_the_walk_lists_every_entry_it_does_not_read(tmp_path: Path) -> None:
    expected = hostile_entries(tmp_path)
    good(tmp_path, 2, size=16)
    Image.new("RGB", (8, 8)).save(tmp_path / "sub" / "deep.png")
    os.symlink(tmp_path / "good_0.png", tmp_path / "link_to_good.png")  # a link to a file: used
    files, skipped = walk_folder(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == [
        "good_0.png",
        "good_1.png",
        "link_to_good.png",
        "sub/deep.png",
    ]
    assert list_images(tmp_path) == files  # sorted, and the same on every call
    assert {s.path.name: s.message for s in skipped}.keys() == expected.keys()
    for s in skipped:
        assert expected[s.path.name] in s.message, s
    log = FolderLog()
    assert sum(b.shape[0] for b in iter_folder(tmp_path, to_tensor, log=log)) == 4
    assert names(log.skipped).keys() == expected.keys()
    only_hidden = tmp_path / "only_hidden"
    only_hidden.mkdir()
    (only_hidden / ".x.png").write_bytes(b"")
    with pytest.raises(InputError, match="holds no file that can be read.*hidden"):
        list_images(only_hidden)


@needs_posix
def test_diagnose_on_a_hostile_folder_lists_every_bad_entry(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    expected = hostile_entries(folder)
    good(folder, 4)
    declared_png(folder / "bomb.png", 20000, 20000)
    declared_png(folder / "big.png", 10000, 10000)
    float_tiff(folder / "float.tif", np.linspace(-1.0, 3.0, 112 * 112).reshape(112, 112))
    int_tiff(folder / "int32.tif", np.arange(112 * 112).reshape(112, 112) * 100)
    nan = np.zeros((16, 16))
    nan[0, 0] = np.nan
    float_tiff(folder / "nan.tif", nan)
    expected |= {"bomb.png": "above the budget", "big.png": "above the budget", "nan.tif": "NaN"}
    out = tmp_path / "run"
    args = ["diagnose", "planted:dinov2_s14", "--img-size", "112", "--images", str(folder)]
    result = CliRunner().invoke(app, [*args, "--max-maps", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.stderr and "Traceback" not in result.output
    assert "DecompressionBomb" not in result.stderr
    data = json.loads((out / "metrics.json").read_text())["data"]
    assert data["n_images"] == 6
    skipped = names(data["skipped"])
    assert skipped.keys() == expected.keys()
    for name, word in expected.items():
        assert word in skipped[name], (name, skipped[name])
    converted = names(data["converted"])
    assert converted["float.tif"].startswith("F, values -1..3 scaled -1..3")
    assert converted["int32.tif"] == "I, values 0..1254300 scaled 0..1254300 -> 0..255"
    assert data["max_pixels"] == MAX_PIXELS


# ------------------------------------------------------------------ probe / train data
def rgb(path: Path, w: int = 40, h: int = 32, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return path


def huge_npy(path: Path, shape: tuple[int, ...]) -> Path:
    """A .npy file whose header declares ``shape`` float32 and which holds no data at all."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": shape}
        )
    return path


def nyu(root: Path, depth: dict[str, dict[str, np.ndarray | None]]) -> Path:
    """``depth[split][key]``: a depth map (None: a huge-header file) for a 40 x 32 image."""
    for split, maps in depth.items():
        (root / split / "depth").mkdir(parents=True)
        for i, (key, d) in enumerate(maps.items()):
            rgb(root / split / "rgb" / f"{key}.jpg", seed=i)
            target = root / split / "depth" / f"{key}.npy"
            huge_npy(target, (100000, 100000)) if d is None else np.save(target, d)
    return root


def tiny_vit() -> vitreg.Model:
    torch.manual_seed(0)
    module = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1
    )
    return vitreg.wrap(module.eval())


def test_a_huge_npy_header_is_skipped_before_anything_is_allocated(tmp_path: Path) -> None:
    ok = np.full((32, 40), 2.0, np.float32)
    root = nyu(tmp_path / "nyu", {"train": {"a": None, "b": ok}})  # a: 100000 x 100000
    huge_npy(root / "train" / "depth" / "c.npy", (32, 40))  # in budget, but holds no data
    rgb(root / "train" / "rgb" / "c.jpg", seed=5)
    ds = open_dataset(f"nyu:{root}", "train")
    used = {s.key for _, s in iter_samples(ds)}
    assert used == {"b"}
    assert ds.log.to_dict() == {"depth_over_pixel_budget": 1, "unreadable_depth": 1}
    with pytest.raises(SkipSample, match="depth_over_pixel_budget"):
        ds[0]


def test_all_nan_depth_is_skipped_and_the_empty_split_named(tmp_path: Path) -> None:
    nan = np.full((32, 40), np.nan, np.float32)
    ok = np.full((32, 40), 2.0, np.float32)
    root = nyu(
        tmp_path / "nyu", {"train": {"a": ok, "b": ok, "c": ok}, "val": {"d": nan, "e": nan}}
    )
    val = open_dataset(f"nyu:{root}", "val")
    assert list(iter_samples(val)) == [] and val.log.to_dict() == {"no_valid_depth": 2}
    with pytest.raises(InputError) as err:
        probe_run(tiny_vit(), "depth", f"nyu:{root}", layers=(0,), cache_dir=tmp_path / "c",
                  config=CFG)  # fmt: skip
    message = str(err.value)
    assert "the test split (val of nyu:" in message and "no_valid_depth: 2" in message


def voc(root: Path, keys: str = "abcde", without_mask: str = "c") -> Path:
    """VOC2012 layout; the samples in ``without_mask`` have no SegmentationClass png."""
    for i, key in enumerate(keys):
        rgb(root / "JPEGImages" / f"{key}.jpg", seed=i)
        if key not in without_mask:
            (root / "SegmentationClass").mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((32, 40), 1 + i % 3, np.uint8)).save(
                root / "SegmentationClass" / f"{key}.png"
            )
    sets = root / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    (sets / "train.txt").write_text("\n".join(keys) + "\n")
    (sets / "val.txt").write_text(keys[0] + "\n")
    return root


def test_voc_without_labels_is_a_clear_train_error_and_a_missing_mask_a_count(tmp_path) -> None:
    from vitreg.train import TrainSettings, train

    spec = f"voc:{voc(tmp_path / 'voc')}"
    kw = {"steps": 1, "batch_size": 4, "img_size": 32, "lr": 1e-3}
    tiny = {"model_kwargs": {"depth": 1, "embed_dim": 32, "num_heads": 2, "patch_size": 8}}
    with pytest.raises(InputError, match="needs class labels.*provides \\['mask'\\] targets"):
        train("vit_tiny_patch16_224", spec, TrainSettings(**kw), tmp_path / "sup", **tiny)
    data = open_data(spec)
    described = describe_training_data(data)
    assert isinstance(described, DataInfo)
    assert described.n_images == 4 and described.n_listed == 5
    assert described.skipped == {"missing_mask": "1 samples skipped"}
    options = {"out_dim": 32, "hidden_dim": 32, "bottleneck_dim": 16, "n_local_crops": 0}
    dino = TrainSettings(recipe="dino", **kw)
    result = train("vit_tiny_patch16_224", data, dino, tmp_path / "dino", options=options, **tiny)
    assert result.steps == 1 and data.log.to_dict() == {"missing_mask": 1}


class Unlabelled(BaseDataset):
    """A labelled dataset one of whose samples comes back without its label."""

    num_classes = 2

    def __init__(self) -> None:
        super().__init__("custom", "custom:", "train", ("label",))

    def __len__(self) -> int:
        return 3

    def _read(self, i: int) -> Sample:
        return Sample(Image.new("RGB", (8, 8)), f"k{i}", label=None if i == 1 else i % 2)

    def _fingerprint_parts(self):
        yield "custom"


def test_a_declared_target_left_empty_is_a_counted_skip() -> None:
    ds = Unlabelled()
    with pytest.raises(SkipSample, match="missing_label"):
        ds[1]
    assert [i for i, _ in iter_samples(ds)] == [0, 2] and ds.log.to_dict() == {"missing_label": 1}


def classes(root: Path, counts: dict[str, int]) -> Path:
    for c, n in counts.items():
        for i in range(n):
            rgb(root / c / f"{i}.jpg", seed=i)
    return root


def test_a_single_class_is_a_recorded_warning(tmp_path: Path) -> None:
    root = classes(tmp_path / "one", {"cat": 6})
    (root / "cat" / ".hidden.jpg").write_bytes(b"")
    (root / "cat" / "notes.txt").write_text("not an image")
    spec = f"imagefolder:{root}"
    assert "only 1 class (cat)" in open_dataset(spec).describe()["warnings"][0]
    result = probe_run(tiny_vit(), "classification", spec, layers=(0,),
                       cache_dir=tmp_path / "cache", config=CFG)  # fmt: skip
    described = model_info(result.model)
    write_probe_run(
        tmp_path / "run", result.results, described, SavedConfig(), "vitreg probe (test)"
    )
    data = json.loads((tmp_path / "run" / "metrics.json").read_text())["data"]
    assert [w.split(":")[0] for w in data["warnings"]] == ["train", "test"]
    assert "top-1 = 1.0 says nothing" in data["warnings"][0]
    assert "Warning" in (tmp_path / "run" / "report.md").read_text()
    listing = {k: v for k, v in data["skipped"].items() if " listing: " in k}
    assert listing == {
        f"{s} listing: {r}": "1 files not read"
        for s in ("train", "test")
        for r in ("hidden", "not_an_image_file")
    }
    two = open_dataset(f"imagefolder:{classes(tmp_path / 'two', {'a': 3, 'b': 3})}")
    assert "warnings" not in two.describe()  # the identity of clean data is unchanged


def test_training_on_one_usable_image_warns_and_records_its_data(tmp_path: Path) -> None:
    from vitreg.report.renderers.train import write_train_run
    from vitreg.train import TrainSettings, train
    from vitreg.verbs.train import describe_trained, train_results

    root = tmp_path / "folder"  # pre-split: train/<class>/, so every file is in the train split
    classes(root / "train", {"a": 1})
    (root / "train" / "a" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    declared_png(root / "train" / "a" / "bomb.png", 20000, 20000)
    (root / "train" / "a" / ".hidden.jpg").write_bytes(b"")
    spec = f"imagefolder:{root}"
    with pytest.warns(DataWarning) as warned:
        data = open_data(spec)
    assert [str(w.message).split(" in ")[0] for w in warned] == ["only 1 usable sample"]
    described = describe_training_data(data)
    assert described.n_images == 1 and described.n_usable == 1
    assert described.skipped == {
        "image_over_pixel_budget": "1 samples skipped",
        "unreadable_image": "1 samples skipped",
    }
    assert described.log["hidden"] == 1
    assert [w.split(" in ")[0] for w in described.warnings] == [
        "only 1 usable sample",
        "only 1 class (a)",
    ]
    dino = describe_training_data(data, recipe="dino")  # labels unused: no class warning
    assert [w.split(" in ")[0] for w in dino.warnings] == ["only 1 usable sample"]
    settings = TrainSettings(steps=1, batch_size=2, img_size=32, lr=1e-3)
    tiny = {"depth": 1, "embed_dim": 32, "num_heads": 2, "patch_size": 8}
    with pytest.warns(DataWarning) as warned:  # the recipe uses the labels: one class warns
        result = train("vit_tiny_patch16_224", data, settings, tmp_path / "run", model_kwargs=tiny)
    assert [str(w.message).split(" in ")[0] for w in warned] == ["only 1 class (a)"]
    config = SavedConfig({"command": "train"})
    write_train_run(tmp_path / "run", train_results(result, tmp_path / "run"), result.history,
                    data=described, config=config,
                    described=describe_trained(result.model, "vit_tiny_patch16_224"),
                    command="vitreg train (test)")  # fmt: skip
    block = json.loads((tmp_path / "run" / "metrics.json").read_text())["data"]
    assert block["n_images"] == 1 and block["skipped"] == described.skipped
    assert block["warnings"] == described.warnings
    broken = tmp_path / "broken"
    for c in "ab":
        (broken / c).mkdir(parents=True)
        (broken / c / "x.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    with pytest.raises(InputError, match="the training split .* no usable sample.*unreadable_im"):
        open_data(f"imagefolder:{broken}")
