"""The one containment rule (issue 24): a path in a folder is read only if it resolves inside it;
links and ``..`` that lead elsewhere are named with where they lead."""

from __future__ import annotations

import pytest

from vitreg.core.containment import check_folder, check_inside, outside
from vitreg.errors import InputError


def test_links_and_dots_that_leave_the_folder_are_outside(tmp_path) -> None:
    folder, elsewhere = tmp_path / "folder", tmp_path / "elsewhere.txt"
    (folder / "sub").mkdir(parents=True)
    elsewhere.write_text("secret")
    (folder / "own.txt").write_text("mine")
    (folder / "sub" / "in.txt").symlink_to(folder / "own.txt")
    (folder / "out.txt").symlink_to(elsewhere)
    (folder / "loop").symlink_to(folder / "loop")
    assert outside(folder, folder / "sub" / "in.txt") is None
    assert outside(folder, folder) is None
    assert outside(folder, folder / "out.txt") == str(elsewhere)
    assert outside(folder, folder / ".." / "elsewhere.txt") == str(elsewhere)
    assert outside(folder, folder / "loop").startswith("a path that cannot be resolved")
    with pytest.raises(InputError, match=r"the file '.*out.txt' leads .* outside the folder"):
        check_inside(folder, folder / "out.txt", "the file")


def test_a_folder_check_names_the_first_entry_that_leads_outside(tmp_path) -> None:
    folder = tmp_path / "model"
    (folder / "nested").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    check_folder(folder, "model folder")
    (folder / "nested" / "weights.bin").symlink_to("/etc/passwd")
    with pytest.raises(InputError, match=r"model folder entry '.*weights.bin' leads .*/etc/passwd"):
        check_folder(folder, "model folder")
