"""render_again: a run's report rendered from its saved results is the report the run wrote
(same Markdown, same figures and captions); a run that writes no report, or a folder that holds
no results, is a clear error."""

from __future__ import annotations

import pytest

import vitreg
from vitreg.configs import DiagnoseConfig, TrainRunConfig
from vitreg.errors import InputError
from vitreg.verbs.report import render_again

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rendered_again_is_the_report_the_run_wrote(tmp_path, cli_models) -> None:
    config = DiagnoseConfig(spec="planted:dinov2_s14", img_size=56, limit=2, batch_size=2)
    run = vitreg.run(config.model_copy(update={"max_maps": 1, "out": tmp_path / "run"}))
    written = (run.run_dir / "report.md").read_text()
    (run.run_dir / "report.md").unlink()
    (run.run_dir / "report.html").unlink()
    assert render_again(run.run_dir) == [run.run_dir / "report.md", run.run_dir / "report.html"]
    assert (run.run_dir / "report.md").read_text() == written
    html = (run.run_dir / "report.html").read_text()
    assert html.count("data:image/png;base64") == len(list(run.run_dir.glob("figures/*.png")))


def test_a_train_run_has_no_report_to_render(tmp_path) -> None:
    values = {"variant": "vit_tiny_patch16_224", "data": "synthetic-cls:n=8,size=32"}
    values |= {"steps": 1, "batch_size": 4, "img_size": 32, "model_arg": ["depth=1"]}
    run = vitreg.run(TrainRunConfig(**values, out=tmp_path / "train"))
    with pytest.raises(InputError, match="`vitreg train` run, which writes no report"):
        render_again(run.run_dir)


def test_a_folder_without_valid_results_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(InputError, match="holds no metrics.json"):
        render_again(tmp_path)
    (tmp_path / "metrics.json").write_text('{"verb": "diagnose"}')
    with pytest.raises(InputError, match="does not follow the schema"):
        render_again(tmp_path)
