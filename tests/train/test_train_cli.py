"""``vitreg train``: a run through the CLI, and its errors (exit 2, one paragraph)."""

import json

from typer.testing import CliRunner

from vitreg.cli.app import app

runner = CliRunner()
TINY = ["depth=2", "embed_dim=64", "num_heads=2", "patch_size=8"]


def invoke(*args: str):
    model = [a for kv in TINY for a in ("--model-arg", kv)]
    return runner.invoke(app, ["train", "vit_tiny_patch16_224", *model, "--img-size", "32", *args])


def test_cli_trains_dino_on_a_synthetic_dataset(tmp_path):
    opts = ["out_dim=64", "hidden_dim=64", "bottleneck_dim=32", "n_local_crops=1"]
    result = invoke(
        "--data", "synthetic-cls:n=8,size=32", "--recipe", "dino", "--out", str(tmp_path),
        "--steps", "2", "--batch-size", "4", *[a for o in opts for a in ("--option", o)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 steps" in result.stdout and str(tmp_path) in " ".join(result.stdout.split())
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert (tmp_path / "model.safetensors").is_file()
    # a report with the loss curve, and the DINO loss read against the teacher's entropy
    assert (tmp_path / "figures" / "training_loss.png").is_file()
    report = (tmp_path / "report.md").read_text()
    assert "training_loss.png" in report and (tmp_path / "report.html").is_file()
    terms = json.loads((tmp_path / "metrics.json").read_text())["results"]["dino_terms"]
    assert terms["out_dim"] == 64 and terms["final"]["step"] == 2
    kl = terms["final"]["loss_dino"] - terms["final"]["teacher_entropy"]
    assert terms["final"]["kl"] == kl >= -1e-4  # a cross-entropy is never below the entropy
    assert "KL(teacher ‖ student)" in report


def test_cli_empty_image_folder_is_a_clean_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = invoke(
        "--data", f"imagefolder:{tmp_path / 'empty'}", "--steps", "1", "--out", str(tmp_path / "o")
    )
    assert result.exit_code == 2, result.output
    err = " ".join(result.stderr.split())
    assert err.startswith("error:") and "empty" in err and "Traceback" not in result.output


def test_cli_bad_arguments_are_clean_errors(tmp_path):
    bad_pair = invoke("--data", "synthetic-cls:n=8", "--steps", "1", "--model-arg", "depth")
    flat = " ".join(bad_pair.stderr.split())
    assert bad_pair.exit_code == 2 and "--model-arg: 'depth' is not KEY=VALUE" in flat
    no_steps = invoke("--data", "synthetic-cls:n=8")
    assert no_steps.exit_code == 2 and "--steps" in no_steps.stderr
    bad_recipe = invoke(
        "--data", "synthetic-cls:n=8", "--steps", "1", "--recipe", "mae", "--out", str(tmp_path)
    )
    assert bad_recipe.exit_code == 2
    assert "--recipe: Input should be 'supervised' or 'dino'" in " ".join(bad_recipe.stderr.split())
    missing = runner.invoke(app, ["train", "--steps", "1"])
    assert missing.exit_code == 2
    assert "--variant: Field required; --data: Field required" in " ".join(missing.stderr.split())
