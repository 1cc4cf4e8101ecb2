"""`dpdistill release` and transcriptions of DP teachers from the command line: one command from the private data to
a student, a generator and a synthetic set under the teacher's one epsilon; a run's student is a teacher as it
stands; a declared guarantee is reported as a claim."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.privacy.ledger import LEDGER_FILE
from dpdistill.privacy.provenance import PROVENANCE

runner = CliRunner()
TINY = ["--set", "batch_size=32", "--set", "student_steps=2", "--set", "replay_size=256",
        "--set", "generator_width=16,8,4", "--set", "eval_every=2"]


def invoke(*args):
    return runner.invoke(app, [str(argument) for argument in args])


def flat(output: str) -> str:
    """The output with the console's line wrapping undone."""
    return " ".join(output.split())


@pytest.mark.slow
def test_release_trains_a_dp_teacher_and_transcribes_it_under_its_epsilon(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))  # digits' examples: this release's alone
    out = tmp_path / "release"
    result = invoke("release", "--dataset", "digits", "--epsilon", 2, "--out", out, "--iterations", 2,
                    "--synthetic-size", 100, "--set", "synthetic_epochs=1", "--teacher-set", "epochs=5", *TINY)
    assert result.exit_code == 0, result.output
    report, teacher = (json.loads((directory / "report.json").read_text()) for directory in (out, out / "teacher"))
    statistics = report["statistics"]  # the teacher's and its statistics' releases, their epsilons added
    assert report["method"] == "release" and report["privacy"]["epsilon"] == pytest.approx(
        teacher["privacy"]["epsilon"] + statistics["epsilon_add_remove"])
    assert report["privacy"]["epsilon"] <= 2
    assert report["teacher"]["accuracy"] == teacher["accuracy"]["student"]
    # the whole release's time grows with the private count (the teacher's training): the private record's only
    private = json.loads((out / "private" / "record.json").read_text())["timing"]
    assert private["with_teacher_seconds"] > report["timing"]["wall_seconds"] and "with_teacher_seconds" not in (
        out / "report.json").read_text()
    assert "wall_seconds" not in teacher["timing"]  # nor does the teacher's report say how long its training took
    assert {"student.safetensors", "generator.safetensors", "synthetic.npz", "samples.png", "report.md"} <= {
        path.name for path in out.iterdir()}
    own, pictured, entry = json.loads((out / "teacher" / LEDGER_FILE).read_text())["entries"]
    assert (own["method"], own["status"]) == ("dpsgd", "own release")  # the release the teacher is
    assert (pictured["method"], pictured["status"]) == ("release: feature statistics", "spent")
    assert pictured["epsilon"] == pytest.approx(statistics["epsilon_replace_one"])
    assert (entry["method"], entry["epsilon"], entry["event"]["type"]) == ("release", 0.0, "NoOpDpEvent")
    assert report["privacy"]["data_set_ledger"]["spent_epsilon"] == pytest.approx(own["epsilon"] + pictured["epsilon"])
    assert json.loads((out / "student.json").read_text())[PROVENANCE]["release"] == "release"
    again = invoke("release", "--dataset", "digits", "--epsilon", 2, "--out", out, "--resume")
    assert again.exit_code == 2 and "has finished" in flat(again.output)


@pytest.mark.parametrize("args, message", [
    (["--epsilon", 0], "epsilon must be positive"),
    (["--epsilon", 1, "--student-arch", "nosuchnet"], "unknown architecture"),
    (["--epsilon", 1, "--set", "synthetic_size=3"], "gives some of the 10 classes no image"),
    (["--epsilon", 1, "--teacher-set", "epochs=0"], "at least 1"),
    (["--epsilon", 1, "--statistics-share", 0.5], "--statistics-share must be in [0, 0.5)"),
    (["--epsilon", 1, "--teacher-arch", "datalens"], "--teacher-arch datalens has no GroupNorm or BatchNorm layer"),
    (["--epsilon", 1, "--set", "target_step=0.5"], "target-step: a setting of a teacher's noisy answers"),
])
def test_a_release_that_cannot_run_is_refused_in_one_line_before_any_write(tmp_path: Path, args, message):
    out = tmp_path / "release"
    result = invoke("release", "--dataset", "digits", "--out", out, *args)
    assert result.exit_code == 2 and message in flat(result.output) and result.output.count("error:") == 1
    assert not out.exists()


def test_a_dp_runs_directory_is_a_teacher_as_it_stands(digits_dp_teacher: Path, tmp_path: Path):
    teacher = Path(shutil.copytree(digits_dp_teacher, tmp_path / "dp"))
    result = invoke("transcribe", "--teacher", teacher, "--privacy", "none", "--iterations", 2, "--out",
                    tmp_path / "tr", *TINY)
    assert result.exit_code == 0, result.output
    assert "post-processing" in flat(result.output)
    privacy = json.loads((tmp_path / "tr" / "report.json").read_text())["privacy"]
    assert privacy["epsilon"] == json.loads((teacher / "report.json").read_text())["privacy"]["epsilon"]
    budget = invoke("budget", teacher)  # what it spent is the release it is: the transcription added nothing
    own = json.loads((teacher / "report.json").read_text())["privacy"]["epsilon_replace_one"]
    assert budget.exit_code == 0 and f"spent: epsilon {own:.4g}" in flat(budget.output)
    unpictured = invoke("transcribe", "--teacher", teacher, "--privacy", "none", "--iterations", 2, "--out",
                        tmp_path / "stats", "--set", "statistics_weight=1", *TINY)
    assert unpictured.exit_code == 2 and "holds none (statistics.safetensors" in flat(unpictured.output)
    assert not (tmp_path / "stats").exists()


def test_a_declared_dp_teacher_is_transcribed_as_its_owners_claim(foreign_teacher, tmp_path: Path):
    factory, weights = foreign_teacher
    imported = invoke("import-teacher", "--factory", f"{factory}:small_resnet", "--weights", weights, "--dataset",
                      "digits", "--out", tmp_path / "imported", "--input-range", "0,1", "--dp-epsilon", 3,
                      "--dp-relation", "replace-one")
    assert imported.exit_code == 0, imported.output
    assert "NOT verified" in flat(imported.output)
    result = invoke("transcribe", "--teacher", tmp_path / "imported", "--privacy", "none", "--iterations", 2,
                    "--out", tmp_path / "tr", *TINY)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "tr" / "report.json").read_text())
    assert report["privacy"]["epsilon"] == 3 and report["privacy"]["teacher_release"]["verified"] is False
    assert "NOT verified by dpdistill" in (tmp_path / "tr" / "report.md").read_text()
    swapped = tmp_path / "imported" / "model.safetensors"  # the claim is bound to the weights it was made for
    swapped.write_bytes((tmp_path / "tr" / "student.safetensors").read_bytes())
    refused = invoke("transcribe", "--teacher", tmp_path / "imported", "--privacy", "none", "--out", tmp_path / "again")
    assert refused.exit_code == 2 and refused.output.count("error:") == 1
    assert f"{swapped} is not the model its provenance" in flat(refused.output) and not (tmp_path / "again").exists()


def test_a_release_whose_teacher_has_no_guarantee_is_recorded_as_unbounded_not_free(tmp_path: Path):
    out = tmp_path / "release"
    result = invoke("release", "--dataset", "digits", "--epsilon", 2, "--out", out, "--iterations", 1,
                    "--synthetic-size", 0, "--teacher-set", "epochs=1", "--teacher-set", "reproducible_noise=true",
                    *TINY)
    assert result.exit_code == 0, result.output
    entries = json.loads((out / "teacher" / LEDGER_FILE).read_text())["entries"]
    assert [(entry["method"], entry["event"]["type"]) for entry in entries] == [
        ("release: feature statistics", "ComposedDpEvent"), ("release", "ComposedDpEvent")]  # its noise too: seeded
    for entry in entries:
        assert entry["epsilon"] == "inf" and entry["event"]["events"][-1]["type"] == "NonPrivateDpEvent"
