"""The last hostile inputs that ended in "this is a bug" or said the wrong thing, one test per
class: each is exit 2 with one paragraph naming the cause, or a counted, reported skip."""

from __future__ import annotations

from typer.testing import CliRunner

from _support.cli_helpers import assert_clean_failure
from vitreg.cli.app import app

runner = CliRunner()


def test_config_duplicate_key_and_boolean_number_are_refused_with_the_key(tmp_path) -> None:
    twice = tmp_path / "twice.yaml"
    twice.write_text("verb: diagnose\nlimit: 3\nlimit: 5\n")
    result = runner.invoke(app, ["diagnose", "--config", str(twice), "--out", str(tmp_path / "a")])
    assert_clean_failure(result, "'limit' twice", "line 3")
    flag = tmp_path / "flag.yaml"
    flag.write_text("verb: diagnose\nlimit: true\n")
    result = runner.invoke(app, ["diagnose", "--config", str(flag), "--out", str(tmp_path / "b")])
    assert_clean_failure(result, "limit is true, but limit is a number")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_folder_of_non_images_says_no_image_could_be_read(tmp_path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(5):  # fewer than discovery's hold-out needs: the files are read first
        (folder / f"f{i}.jpg").write_text(f"not an image {i}")
    out = tmp_path / "run"
    args = ["neurons", "planted:dinov2_s14", "--img-size", "56", "--images", str(folder)]
    result = runner.invoke(app, [*args, "--out", str(out)])
    err = assert_clean_failure(result, "no readable image", "f0.jpg: could not be decoded")
    assert "holds out" not in err and not out.exists()
