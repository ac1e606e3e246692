"""Image folders: unreadable files are skipped with reasons, non-RGB files converted and listed."""

import numpy as np
import pytest
import torch
from PIL import Image

from vitreg import InputError
from vitreg.data.folder import FolderLog, iter_folder, to_rgb


def to_tensor(img):
    return torch.from_numpy(np.asarray(img.resize((8, 8)), dtype=np.float32)).permute(2, 0, 1)


@pytest.fixture
def messy(tmp_path):
    Image.new("RGB", (10, 10), (200, 10, 10)).save(tmp_path / "a_rgb.jpg")
    Image.new("L", (10, 10), 128).save(tmp_path / "b_gray.png")
    Image.new("RGBA", (10, 10), (0, 0, 255, 0)).save(tmp_path / "c_rgba.png")
    Image.fromarray(np.full((10, 10), 65535, dtype=np.uint16)).save(tmp_path / "d_16bit.png")
    (tmp_path / "e_corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (tmp_path / "f_notes.txt").write_text("hello")
    return tmp_path


def test_bad_files_are_skipped_and_non_rgb_converted(messy):
    log = FolderLog()
    batches = list(iter_folder(messy, to_tensor, batch_size=3, log=log))
    assert [b.shape[0] for b in batches] == [3, 1]
    names = {p.split("/")[-1] for p in log.used}
    assert names == {"a_rgb.jpg", "b_gray.png", "c_rgba.png", "d_16bit.png"}
    converted = {k.split("/")[-1]: v for k, v in log.converted.items()}
    assert converted == {
        "b_gray.png": "L",
        "c_rgba.png": "RGBA",
        "d_16bit.png": "I;16, values 65535..65535 scaled 0..65535 -> 0..255",
    }
    skipped = {k.split("/")[-1]: v for k, v in log.skipped.items()}
    assert "decoded" in skipped["e_corrupt.jpg"] and "not an image" in skipped["f_notes.txt"]
    # transparent pixels composite on white; 16-bit white stays white
    assert batches[0][2].mean() == pytest.approx(255.0)
    assert batches[1][0].mean() == pytest.approx(255.0)
    assert len(log.used) == 4


def test_limit_and_empty_or_unreadable_folders(messy, tmp_path_factory):
    log = FolderLog()
    assert sum(b.shape[0] for b in iter_folder(messy, to_tensor, limit=2, log=log)) == 2
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(InputError, match="empty"):
        list(iter_folder(empty, to_tensor))
    with pytest.raises(InputError, match="does not exist"):
        list(iter_folder(empty / "nope", to_tensor))
    junk = tmp_path_factory.mktemp("junk")
    (junk / "x.png").write_bytes(b"garbage")
    with pytest.raises(InputError, match="no readable image"):
        list(iter_folder(junk, to_tensor))


def test_to_rgb_leaves_rgb_alone():
    img = Image.new("RGB", (2, 2))
    assert to_rgb(img) == (img, None)
