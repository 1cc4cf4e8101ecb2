"""The command line: working paths print results, user mistakes print one clear error and exit 2."""

import json
import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpdistill import runs
from dpdistill.cli.main import app

from helpers import write_idx_folder, write_image_folder

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_data_list_shows_the_embedded_set():
    result = invoke("data", "list")
    assert result.exit_code == 0
    assert "digits" in result.output and "fmnist" in result.output


def test_evaluate_a_teacher(digits_teacher: Path):
    result = invoke("evaluate", "--model", digits_teacher, "--dataset", "digits")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["accuracy"] > 0.9


def test_transcribe_writes_a_report(digits_teacher: Path, tmp_path: Path):
    result = invoke("transcribe", "--teacher", digits_teacher, "--out", tmp_path, "--privacy", "data",
                    "--epsilon", "5", "--preset", "demo", "--iterations", "6", "--batch-size", "32",
                    "--gradient-op", "clip")  # data mode: the gradient operation bounds the released answers
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["privacy_mode"] == "data" and 4.99 < report["privacy"]["epsilon"] <= 5
    assert report["config"]["iterations"] == 6 and report["config"]["gradient_operation"] == "clip"
    assert report["privacy"]["queries"] == 6 * 32
    evaluated = invoke("evaluate", "--model", tmp_path, "--dataset", "digits")
    assert evaluated.exit_code == 0, evaluated.output


def test_reproducible_noise_is_a_debugging_flag_that_voids_the_guarantee(digits_teacher: Path,
                                                                          digits_ensemble: Path, tmp_path: Path):
    transcription = invoke("transcribe", "--teacher", digits_teacher, "--out", tmp_path / "t", "--epsilon", "5",
                           "--preset", "demo", "--iterations", "2", "--batch-size", "8", "--reproducible-noise")
    assert transcription.exit_code == 0, transcription.output
    pate = invoke("pate", "--teacher", digits_ensemble, "--out", tmp_path / "p", "--epsilon", "5", "--queries", "20",
                  "--public-size", "200", "--min-steps", "5", "--self-training-rounds", "0", "--reproducible-noise")
    assert pate.exit_code == 0, pate.output
    for run in ("t", "p"):
        report = json.loads((tmp_path / run / "report.json").read_text())
        assert report["config"]["reproducible_noise"] is True
        assert report["privacy"]["covered"] == "NO guarantee: the noise is reproducible"
        assert report["privacy"]["formal_guarantee"] is False


def _transcribe(teacher: Path, out: Path, *extra: str):
    return invoke("transcribe", "--teacher", teacher, "--out", out, "--iterations", "2", "--batch-size", "8", *extra)


@pytest.mark.parametrize("extra, message", [
    (("--epsilon", "0"), "epsilon must be positive"),
    (("--epsilon", "-1"), "epsilon must be positive"),
    (("--epsilon", "1", "--delta", "1.5"), "delta must be in (0, 1)"),
    (("--epsilon", "1", "--delta", "0"), "delta must be in (0, 1)"),
    (("--epsilon", "1", "--top-k", "11"), "top-k"),
    (("--epsilon", "1", "--dataset", "nope"), "unknown dataset"),
    (("--epsilon", "1", "--dataset", "fmnist"), "expects"),
    (("--epsilon", "1", "--sigma", "1", "--iterations", "500"), "budget"),
    (("--epsilon", "1", "--preset", "fancy"), "unknown preset"),
    (("--epsilon", "1", "--method", "magic"), "unknown method"),
    (("--epsilon", "1", "--set", "replay_size"), "KEY=VALUE"),
    (("--epsilon", "1", "--set", "warp_drive=on"), "cannot set"),
    (("--epsilon", "1", "--set", "student_steps=lots"), "expects"),
    (("--epsilon", "1", "--preset", "paper,fancy"), "unknown preset"),
    (("--epsilon", "1", "--gradient-op", "round"), "unknown gradient operation"),
    ((), "epsilon"),
])
def test_transcribe_error_paths(digits_teacher: Path, tmp_path: Path, monkeypatch, extra, message):
    write_idx_folder(tmp_path / "fmnist")  # a Fashion-MNIST of 6 x 6 images: no installed data set needed
    monkeypatch.setenv("DPDISTILL_FMNIST_DIR", str(tmp_path / "fmnist"))
    result = _transcribe(digits_teacher, tmp_path / "out", *extra)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output
    assert not (tmp_path / "out" / "report.json").exists()


def test_missing_teacher(tmp_path: Path):
    result = _transcribe(tmp_path / "absent", tmp_path / "out", "--epsilon", "1")
    assert result.exit_code == 2
    assert "train-teacher" in result.output


def test_corrupt_teacher_checkpoint(digits_teacher: Path, tmp_path: Path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("meta.json", "model.json"):
        (broken / name).write_text((digits_teacher / name).read_text())
    (broken / "model.safetensors").write_bytes(b"PK\x03\x04 not safetensors at all" * 10)
    result = _transcribe(broken, tmp_path / "out", "--epsilon", "1")
    assert result.exit_code == 2
    assert "safetensors" in result.output


def test_train_teacher_on_unknown_dataset(tmp_path: Path):
    result = invoke("train-teacher", "--dataset", "cifar-1000", "--out", tmp_path)
    assert result.exit_code == 2
    assert "unknown dataset" in result.output


def test_resume_without_a_run(digits_teacher: Path, tmp_path: Path):
    result = _transcribe(digits_teacher, tmp_path / "fresh", "--epsilon", "1", "--resume")
    assert result.exit_code == 2
    assert "nothing to resume" in result.output


def test_train_an_ensemble_and_transcribe_it(tmp_path: Path):
    result = invoke("train-teacher", "--dataset", "digits", "--out", tmp_path / "ensemble", "--partitions", "3",
                    "--dirichlet-alpha", "1.0", "--min-steps", "10")
    assert result.exit_code == 0, result.output
    assert "ensemble of 3" in result.output
    assert sorted(p.name for p in (tmp_path / "ensemble").glob("member-*")) == ["member-000", "member-001", "member-002"]
    result = _transcribe(tmp_path / "ensemble", tmp_path / "student", "--privacy", "label", "--epsilon", "1",
                         "--preset", "demo", "--iterations", "2")
    assert result.exit_code == 0, result.output
    assert "teachers (ensemble)" in result.output


@pytest.mark.parametrize("extra, message", [(("--dirichlet-alpha", "0.5"), "--partitions > 1"),
                                            (("--partitions", "2000"), "cannot fill"),
                                            (("--partitions", "3", "--resume"), "nothing to resume"),
                                            (("--heads-only", "--init", "encoder"), "--partitions > 1"),
                                            (("--partitions", "3", "--heads-only"), "give a pretrained encoder"),
                                            (("--partitions", "3", "--init", "scatter"), "add --heads-only")])
def test_impossible_ensembles_are_refused(tmp_path: Path, extra, message):
    result = invoke("train-teacher", "--dataset", "digits", "--out", tmp_path, *extra)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def _train_private(out: Path, *extra: str):
    return invoke("train-private", "--out", out, "--batch-size", "64", "--lr", "3e-3", *extra)


@pytest.mark.slow
def test_train_private_dpsgd_from_the_command_line(tmp_path: Path):
    result = _train_private(tmp_path, "--dataset", "digits", "--epsilon", "2", "--epochs", "2")  # (10: 9 s more)
    assert result.exit_code == 0, result.output
    assert "covered by the guarantee: the student (DP-SGD" in result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["privacy"]["epsilon"] <= 2 and report["privacy"]["epsilon_opacus"] > 0
    evaluated = invoke("evaluate", "--model", tmp_path, "--dataset", "digits")
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["accuracy"] == pytest.approx(report["accuracy"]["student"])


@pytest.mark.slow
def test_train_private_dpdfd_direct_says_it_has_no_formal_guarantee(tmp_path: Path):
    result = _train_private(tmp_path, "--dataset", "digits", "--method", "dpdfd-direct", "--epsilon", "50",
                            "--epochs", "1")
    assert result.exit_code == 0, result.output
    assert "covered by the guarantee: NO formal guarantee" in result.output
    assert "output gradients only" in result.output


@pytest.mark.parametrize("extra, message", [
    (("--dataset", "digits", "--epsilon", "1", "--method", "magic"), "unknown method 'magic'"),
    (("--dataset", "digits", "--epsilon", "0"), "epsilon must be positive"),
    (("--dataset", "digits", "--epsilon", "1", "--delta", "1.5"), "delta must be in (0, 1)"),
    (("--dataset", "digits"), "--epsilon is required"),
    (("--dataset", "digits", "--epsilon", "1000000"), "above 1000, the largest budget"),  # was a 48 GiB MemoryError
    (("--dataset", "digits", "--epsilon", "1", "--sigma", "0.7"), "> budget 1.0"),  # 6.1 (0.3: 51, 3 s to account)
    (("--dataset", "nope", "--epsilon", "1"), "unknown dataset 'nope'"),
    (("--dataset", "digits", "--epsilon", "1", "--resume"), "nothing to resume"),
    (("--dataset", "digits", "--epsilon", "1", "--student-arch", "datalens", "--train-layers", "head"),
     "--train-layers head trains a linear layer"),
    (("--dataset", "digits", "--epsilon", "1", "--optimizer", "rmsprop"), "unknown --optimizer 'rmsprop'"),
    (("--dataset", "digits", "--epsilon", "1", "--student-arch", "cnn", "--student-init", "no-such-encoder",
      "--public-size", "200"), "no encoder at no-such-encoder"),
    (("--dataset", "digits", "--epsilon", "1", "--student-init", "no-such-encoder"), "a public pool of 5000"),
])
def test_train_private_error_paths(tmp_path: Path, extra, message):
    result = _train_private(tmp_path / "out", *extra)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert not (tmp_path / "out" / "report.json").exists()


def test_pate_resumes_with_its_saved_settings(digits_ensemble: Path, tmp_path: Path, monkeypatch):
    from dpdistill.methods import pate as pate_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pate_module, "train_student", interrupted)
    first = invoke("pate", "--teacher", digits_ensemble, "--out", tmp_path / "run", "--epsilon", "1000",
                   "--queries", "50", "--public-size", "200", "--min-steps", "20", "--self-training-rounds", "0")
    assert first.exit_code != 0 and (tmp_path / "run" / "private" / "resume").exists()
    monkeypatch.undo()
    resumed = invoke("pate", "--teacher", digits_ensemble, "--out", tmp_path / "run", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "pate student rounds 1/1" in resumed.output  # the saved single round, not the option's default of 2
    assert json.loads((tmp_path / "run" / "report.json").read_text())["privacy"]["queries"] == 50


@pytest.mark.parametrize("teacher, extra, message", [
    ("single", ("--epsilon", "1"), "needs an ensemble"),
    ("ensemble", ("--epsilon", "1", "--queries", "300"), "public images"),
    ("ensemble", (), "budget"),
    ("ensemble", ("--resume",), "nothing to resume"),
    ("ensemble", ("--epsilon", "1", "--query-selection", "best"), "unknown query selection 'best'"),
    ("ensemble", ("--epsilon", "1", "--student-training", "mixup"), "unknown student training 'mixup'"),
    ("ensemble", ("--epsilon", "1", "--answer-targets", "mean"), "unknown answer targets 'mean'"),
    ("ensemble", ("--epsilon", "1", "--student-training", "consistency", "--unlabelled-ratio", "0"),
     "unlabelled-ratio must be at least 1"),
])
def test_pate_error_paths(digits_teacher: Path, digits_ensemble: Path, tmp_path: Path, teacher, extra, message):
    directory = digits_teacher if teacher == "single" else digits_ensemble
    result = invoke("pate", "--teacher", directory, "--out", tmp_path / "run", "--queries", "50", "--public-size",
                    "200", *extra)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "run" / "student.safetensors").exists()


def test_pretrain_then_start_an_ensemble_and_a_pate_student_from_the_encoder(digits_ensemble: Path, tmp_path: Path):
    result = invoke("pretrain", "--dataset", "digits", "--public-size", "200", "--steps", "4", "--batch-size", "32",
                    "--out", tmp_path / "encoder")
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "encoder" / "encoder.json").read_text())
    assert meta["kind"] == "encoder" and "first 200 test images" in meta["pretrained_on"]
    teachers = invoke("train-teacher", "--dataset", "digits", "--partitions", "2", "--min-steps", "5", "--epochs",
                      "1", "--init", tmp_path / "encoder", "--out", tmp_path / "teachers")
    assert teachers.exit_code == 0, teachers.output
    report = json.loads((tmp_path / "teachers" / "report.json").read_text())
    assert report["config"]["init"] == str(tmp_path / "encoder")
    student = invoke("pate", "--teacher", digits_ensemble, "--epsilon", "10", "--queries", "50", "--public-size",
                     "200", "--min-steps", "5", "--self-training-rounds", "0", "--student-arch", "cnn",
                     "--student-init", tmp_path / "encoder", "--out", tmp_path / "pate")
    assert student.exit_code == 0, student.output
    assert json.loads((tmp_path / "pate" / "report.json").read_text())["config"]["student_init"] == \
        str(tmp_path / "encoder")
    # The wrong architecture fails before the ensemble is asked: no answers are spent.
    wrong = invoke("pate", "--teacher", digits_ensemble, "--epsilon", "10", "--queries", "50", "--public-size", "200",
                   "--student-init", tmp_path / "encoder", "--out", tmp_path / "wrong")
    assert wrong.exit_code == 2 and "needs 'datalens'" in " ".join(wrong.output.split()), wrong.output
    assert not (tmp_path / "wrong" / "private" / "resume").exists()
    # An encoder is not a teacher.
    refused = invoke("transcribe", "--teacher", tmp_path / "encoder", "--epsilon", "10", "--out", tmp_path / "t")
    assert refused.exit_code == 2, refused.output
    # Members as heads on the frozen encoder, asked by PATE like any ensemble.
    heads = invoke("train-teacher", "--dataset", "digits", "--partitions", "3", "--min-steps", "20", "--heads-only",
                   "--lr", "0.05", "--init", tmp_path / "encoder", "--out", tmp_path / "heads")
    assert heads.exit_code == 0 and "ensemble of 3" in heads.output, heads.output
    answered = invoke("pate", "--teacher", tmp_path / "heads", "--epsilon", "10", "--queries", "50", "--public-size",
                      "200", "--min-steps", "5", "--self-training-rounds", "0", "--out", tmp_path / "pate-heads")
    assert answered.exit_code == 0, answered.output
    assert json.loads((tmp_path / "pate-heads" / "report.json").read_text())["privacy"]["teachers"] == 3


@pytest.mark.parametrize("command", [("train-teacher", "--dataset", "digits"),
                                     ("train-private", "--dataset", "digits", "--epsilon", "1"),
                                     ("pretrain", "--dataset", "digits")])
@pytest.mark.parametrize("where, message", [("file", "is a file"), ("file/run", "is inside")])
def test_an_out_that_cannot_hold_the_run_is_refused_before_any_work(tmp_path: Path, command, where, message):
    (tmp_path / "file").write_text("mine")
    result = invoke(*command, "--out", tmp_path / where)
    assert result.exit_code == 2 and message in " ".join(result.output.split())
    assert "Traceback" not in result.output and (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("command", [("train-teacher",), ("train-private", "--epsilon", "1")])
def test_a_misspelt_class_folder_is_refused_in_one_line_before_any_work(tmp_path: Path, command):
    root = write_image_folder(tmp_path / "pets")
    (root / "test" / "dog").rename(root / "test" / "dgo")
    result = invoke(*command, "--dataset", root, "--out", tmp_path / "run")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"error: class folders in one split only: {root / 'train' / 'dog'} (not in test/, "
                                    f"whose classes are cat, dgo, emu); {root / 'test' / 'dgo'} (not in train/, whose "
                                    f"classes are cat, dog, emu)")
    assert not (tmp_path / "run").exists()


def test_an_unwritable_out_is_refused(tmp_path: Path, monkeypatch):
    real_access = os.access  # as root every folder is writable: this one is made to say it is not
    monkeypatch.setattr(runs.os, "access", lambda path, mode, **kw: str(path) != str(tmp_path)
                        and real_access(path, mode, **kw))
    result = invoke("train-private", "--dataset", "digits", "--epsilon", "1", "--out", tmp_path / "new")
    assert result.exit_code == 2 and "not writable" in result.output and not (tmp_path / "new").exists()


def test_an_error_stays_on_one_line_whatever_the_path_length_and_terminal_width(tmp_path: Path):
    (tmp_path / "file").write_text("mine")
    out = tmp_path / "file" / ("a-long-folder-name-" * 11)[:200]
    result = runner.invoke(app, ["train-private", "--dataset", "digits", "--epsilon", "1", "--out", str(out)],
                           env={"COLUMNS": "40"})
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1
    assert str(out) in errors[0] and errors[0].endswith("which is a file: give a directory")


def test_an_error_prints_its_brackets_as_written(tmp_path: Path):
    (tmp_path / "file").write_text("mine")
    out = tmp_path / "file" / "[" / "x] [bold]"  # "[/x]" and "[bold]" read as markup would fail or vanish
    result = invoke("train-private", "--dataset", "digits", "--epsilon", "1", "--out", out)
    assert result.exit_code == 2 and f"error: --out {out} " in result.output.replace("\n", "")


@pytest.mark.slow
def test_runs_leave_no_lock_behind(tmp_path: Path):
    refused = invoke("train-private", "--dataset", "digits", "--epsilon", "1", "--resume", "--out", tmp_path)
    assert refused.exit_code == 2 and "nothing to resume" in refused.output
    assert list(tmp_path.iterdir()) == []  # refused after taking the lock: an existing folder stays as it was
    finished = invoke("train-private", "--dataset", "digits", "--epsilon", "10", "--sigma", "2", "--epochs", "1",
                      "--batch-size", "256", "--out", tmp_path / "run")  # a given sigma: accounting 1 s, not 5
    assert finished.exit_code == 0, finished.output
    assert not (tmp_path / "run" / ".lock").exists() and (tmp_path / "run" / "report.json").exists()


def _one_error(result) -> str:
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    return " ".join(result.output.split())


def test_a_non_empty_out_is_refused_unless_overwrite_and_overwrite_removes_only_run_outputs(tmp_path: Path):
    out = tmp_path / "teacher"
    teacher = ("train-teacher", "--dataset", "digits", "--out", out, "--epochs", "1", "--min-steps", "0")
    assert invoke(*teacher).exit_code == 0
    written = (out / "report.json").stat().st_mtime_ns
    refused = _one_error(invoke(*teacher))
    assert "is not empty (it holds a finished run)" in refused and "--overwrite" in refused
    assert (out / "report.json").stat().st_mtime_ns == written  # refused before any work
    assert invoke(*teacher, "--overwrite").exit_code == 0
    (out / "notes.txt").write_text("mine")
    assert "does not write (notes.txt)" in _one_error(invoke(*teacher, "--overwrite"))
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").exists()  # nothing deleted
    (out / "notes.txt").unlink()
    assert invoke("budget", out, "--set", "5").exit_code == 0
    assert "release ledger" in _one_error(invoke(*teacher, "--overwrite"))
    assert (out / "ledger.json").exists()


def test_a_refused_overwrite_loses_nothing_of_the_previous_run(digits_teacher: Path, tmp_path: Path):
    """--overwrite clears the old outputs only once the new run's checks pass: a data set that does not exist, or a
    budget the plan cannot fit, leaves the earlier run as it was."""
    out = tmp_path / "run"
    assert _transcribe(digits_teacher, out, "--epsilon", "5", "--preset", "demo").exit_code == 0
    before = {path.name: path.stat().st_mtime_ns for path in out.iterdir()}
    assert "no-such-data" in _one_error(_transcribe(digits_teacher, out, "--epsilon", "5", "--preset", "demo",
                                                    "--dataset", "no-such-data", "--overwrite"))
    assert "budget" in _one_error(_transcribe(digits_teacher, out, "--epsilon", "1", "--sigma", "1", "--iterations",
                                              "500", "--overwrite"))
    teacher = ("train-teacher", "--dataset", "no-such-data", "--out", out, "--overwrite")
    assert "no-such-data" in _one_error(invoke(*teacher))
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir()} == before


def test_overwrite_leaves_nothing_of_the_previous_run(digits_teacher: Path, digits_ensemble: Path, tmp_path: Path):
    out = tmp_path / "run"
    assert _transcribe(digits_teacher, out, "--epsilon", "5", "--preset", "demo").exit_code == 0
    assert (out / "generator.safetensors").exists()
    pate = ("pate", "--teacher", digits_ensemble, "--out", out, "--epsilon", "5", "--queries", "20",
            "--public-size", "200", "--min-steps", "5", "--self-training-rounds", "0")
    assert "not empty" in _one_error(invoke(*pate))
    replaced = invoke(*pate, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert json.loads((out / "report.json").read_text())["method"] == "pate"
    for name in ("generator.safetensors", "generator.json", "latents.safetensors", "samples.png", "training.png"):
        assert not (out / name).exists(), name
    assert (out / "answers.safetensors").exists() and (out / "private" / "record.json").exists()


def test_resume_on_a_finished_run_says_it_has_finished(digits_teacher: Path, tmp_path: Path):
    assert _transcribe(digits_teacher, tmp_path / "run", "--epsilon", "5", "--preset", "demo").exit_code == 0
    message = _one_error(_transcribe(digits_teacher, tmp_path / "run", "--epsilon", "5", "--resume"))
    assert f"the run in {tmp_path / 'run'} has finished: there is nothing to resume" in message


def test_sigterm_exits_130_and_leaves_a_run_that_resumes(digits_teacher: Path, tmp_path: Path, monkeypatch):
    """A scheduler's SIGTERM, delivered to this process right after the first checkpoint, ends the run like Ctrl-C."""
    from dpdistill.methods.engine import TranscriptionEngine

    checkpoint = TranscriptionEngine._checkpoint

    def checkpoint_then_terminate(self) -> None:
        checkpoint(self)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(TranscriptionEngine, "_checkpoint", checkpoint_then_terminate)
    arguments = ("transcribe", "--teacher", digits_teacher, "--out", tmp_path, "--epsilon", "5", "--preset", "demo",
                 "--iterations", "6", "--batch-size", "8", "--set", "checkpoint_every=2")
    try:
        result = invoke(*arguments)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output and "--resume" in result.output
    state = tmp_path / "private" / "resume"
    assert (state / "state.json").exists() and len(list((state / "answers").iterdir())) == 2
    assert not (tmp_path / "report.json").exists()
    monkeypatch.undo()
    resumed = invoke(*arguments, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((tmp_path / "report.json").read_text())["privacy"]["queries"] == 6 * 8


@pytest.mark.parametrize("extra, message", [
    ((), "budget"),
    (("--epsilon", "3", "--baseline", "BASELINE"), "queries=N"),
    (("--epsilon", "1", "--baseline", "BASELINE", "--sample-source", "BASELINE"), "drop --sample-source"),
    (("--epsilon", "1", "--baseline", "ENSEMBLE"), "holds an ensemble"),
    (("--epsilon", "1", "--set", "generator_steps=0"), "generator steps must be at least 1"),
    (("--epsilon", "1", "--set", "colour=red"), "cannot set 'colour=red'"),
    (("--resume",), "nothing to resume"),
])
def test_dgd_error_paths(digits_teacher: Path, digits_ensemble: Path, tmp_path: Path, extra, message):
    named = {"BASELINE": digits_teacher, "ENSEMBLE": digits_ensemble}
    result = invoke("dgd", "--teacher", digits_ensemble, "--out", tmp_path / "run",
                    *(named.get(part, part) for part in extra))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "run" / "student.safetensors").exists()


@pytest.mark.parametrize("extra, message", [
    (("--method", "nonprivate", "--epsilon", "1"), "no epsilon"),
    (("--method", "dpsgd"), "--epsilon"),
    (("--method", "dpsgd", "--epsilon", "1", "--canaries", "1"), "between 2 and half"),
    (("--method", "pate-fast", "--epsilon", "1"), "unknown audited route 'pate-fast'"),
    (("--method", "pate", "--epsilon", "1", "--teachers", "1"), "at least 2"),
    (("--method", "pate", "--epsilon", "1", "--canaries", "200", "--set", "queries=0"), "queries"),
    (("--method", "dpsgd", "--epsilon", "1", "--teachers", "5"), "drop --teachers"),
    (("--method", "datalens", "--epsilon", "1", "--canaries", "200", "--student-arch", "cnn"),
     "no setting 'student_arch'"),
])
def test_audit_error_paths(tmp_path: Path, extra, message):
    result = invoke("audit", "--dataset", "digits", "--out", tmp_path / "audit", *extra)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "audit" / "private").exists()
