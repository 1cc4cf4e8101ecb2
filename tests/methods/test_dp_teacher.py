"""A teacher that is itself a DP release is transcribed at no further cost: its epsilon is the run's, its ledger
records the run as free, every output carries its provenance, and whatever reads private data besides voids it. A
provenance is checked against the weights and the run it describes, and carries the notes of settings chosen on the
private data."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from dpdistill.data import load_dataset
from dpdistill.errors import BudgetExceededError, CheckpointError, ConfigError
from dpdistill.methods.config import build_config
from dpdistill.methods.teachers import DATA_DIGEST, teacher_provenance
from dpdistill.methods.transcription import DP_TEACHER_COVERS
from dpdistill.pipeline import train_private, transcribe
from dpdistill.privacy.ledger import LEDGER_FILE, ReleaseLedger
from dpdistill.privacy.provenance import PROVENANCE
from dpdistill.privacy.selection import SELECTION, Selection
from dpdistill.training import private
from dpdistill.training.private import PrivateTrainingConfig
from helpers import TeacherReads, charged_queries, write_sample_source

SMALL = {"iterations": 3, "batch_size": 32, "student_steps": 2, "replay_size": 256, "generator_width": (16, 8, 4),
         "eval_every": 3}


@pytest.fixture
def dp_teacher(digits_dp_teacher: Path, tmp_path: Path) -> Path:
    """The session's DP teacher, copied: each test writes its own ledger."""
    return Path(shutil.copytree(digits_dp_teacher, tmp_path / "dp-teacher"))


def teacher_privacy(teacher: Path) -> dict:
    return json.loads((teacher / "report.json").read_text())["privacy"]


def test_a_dp_teacher_is_transcribed_at_its_own_epsilon_and_charged_nothing(dp_teacher: Path, tmp_path: Path,
                                                                           teacher_reads: TeacherReads):
    config = build_config(None, SMALL, {"mode": "none"}, dp_teacher=True)  # no --epsilon: nothing is spent
    report = transcribe(dp_teacher, config, tmp_path / "run")
    assert teacher_reads.examples > 0  # the engine read the teacher without noise: post-processing
    privacy, stated = report["privacy"], teacher_privacy(dp_teacher)
    assert privacy["epsilon"] == stated["epsilon"] and privacy["delta"] == stated["delta"]
    assert privacy["relation"] == "add-remove" and privacy["epsilon_replace_one"] == stated["epsilon_replace_one"]
    assert privacy["covered"] == DP_TEACHER_COVERS and "formal_guarantee" not in privacy
    assert privacy["teacher_release"]["release"] == "dpsgd" and privacy["teacher_release"]["verified"]
    # its ledger: the release the teacher is, and the transcription's, which adds nothing
    assert privacy["ledger"]["spent_epsilon"] == pytest.approx(stated["epsilon_replace_one"])
    assert charged_queries(dp_teacher, tmp_path / "run") == 0  # a NoOpDpEvent
    assert report["accuracy"]["teacher"] == pytest.approx(
        json.loads((dp_teacher / "report.json").read_text())["accuracy"]["student"])  # public: a DP release
    student = json.loads((tmp_path / "run" / "student.json").read_text())
    assert student[PROVENANCE]["epsilon"] == stated["epsilon"]  # the student is a DP release too: a free teacher
    assert "post-processing" in (tmp_path / "run" / "report.md").read_text()
    # the preset's engine settings were chosen on the MNIST set, not on digits
    assert privacy[SELECTION] == ["the dp-teacher preset's engine settings were chosen on the MNIST set "
                                  "(transcriptions of its DP-SGD teacher): a fixed public choice for this data"]
    assert student[PROVENANCE]["notes"] == privacy[SELECTION]
    assert "## Settings chosen on data" in (tmp_path / "run" / "report.md").read_text()
    assert teacher_provenance(tmp_path / "run").verified  # the student's provenance checks out as written


def test_the_dp_teacher_preset_relabels_augmented_samples_and_drops_batchnorm_matching(dp_teacher: Path):
    config = build_config(None, {}, {"mode": "none"}, dp_teacher=True)
    assert config.augment_shift > 0 and config.augment_flip and config.batchnorm_weight == 0
    assert build_config(None, {}, {"mode": "none"}).batchnorm_weight > 0  # a teacher trained without DP: unchanged


def test_noisy_answers_from_a_dp_teacher_compose_in_its_ledger_as_usual(dp_teacher: Path, tmp_path: Path):
    config = build_config("demo", {**SMALL, "student_arch": "datalens"}, {"mode": "data", "epsilon": 5.0})
    report = transcribe(dp_teacher, config, tmp_path / "run")
    privacy = report["privacy"]
    assert privacy["epsilon"] == teacher_privacy(dp_teacher)["epsilon"]  # post-processing bounds it whatever the noise
    assert 4.9 < privacy["route_epsilon"] <= 5.0
    own = teacher_privacy(dp_teacher)["epsilon_replace_one"]  # the teacher's own release, added (basic composition)
    assert privacy["ledger"]["spent_epsilon"] == pytest.approx(own + privacy["route_epsilon"])
    assert charged_queries(dp_teacher, tmp_path / "run") == 3 * 32


def test_a_teacher_trained_without_dp_is_unprotected_as_before(digits_teacher: Path, tmp_path: Path):
    teacher = Path(shutil.copytree(digits_teacher, tmp_path / "teacher"))
    report = transcribe(teacher, build_config("demo", SMALL, {"mode": "none"}), tmp_path / "run")
    assert report["privacy"]["formal_guarantee"] is False and "teacher_release" not in report["privacy"]
    assert ReleaseLedger(teacher).read().spent() == float("inf")


def test_a_dp_teacher_with_a_sample_source_is_refused_before_any_write(dp_teacher: Path, tmp_path: Path):
    digits = load_dataset("digits")
    source = write_sample_source(tmp_path / "source", digits.x_test[:50].numpy(), digits.y_test[:50].numpy())
    config = build_config(None, {**SMALL, "sample_source": str(source), "discriminator": "student",
                                 "adversarial_weight": 0.0, "generator_student_weight": 1.0}, {"mode": "none"},
                          dp_teacher=True)
    with pytest.raises(ConfigError, match="sample source"):
        transcribe(dp_teacher, config, tmp_path / "run")
    assert not (tmp_path / "run").exists() and len(ReleaseLedger(dp_teacher).read().entries) == 1  # its own


@pytest.mark.slow
def test_the_synthetic_set_is_balanced_labelled_by_the_dp_teacher_and_measured(dp_teacher: Path, tmp_path: Path):
    config = build_config(None, {**SMALL, "synthetic_size": 203, "synthetic_epochs": 1}, {"mode": "none"},
                          dp_teacher=True)
    report = transcribe(dp_teacher, config, tmp_path / "run")
    with np.load(tmp_path / "run" / "synthetic.npz") as arrays:
        x, y = arrays["x"], arrays["y"]
    assert x.dtype == np.float32 and x.shape[1:] == (1, 8, 8) and -1 <= x.min() and x.max() <= 1
    synthetic = report["synthetic"]
    assert synthetic["per_class"] == np.bincount(y, minlength=10).tolist() and len(y) == synthetic["images"]
    assert max(synthetic["per_class"]) <= 21  # at most 203 / 10 rounded up a class
    assert "the teacher" in synthetic["labelled_by"] and synthetic["classifier"] == "datalens"
    assert 0 <= report["accuracy"]["synthetic"] <= 1 and synthetic["fidelity"]["synthetic_to_real"] >= 0
    assert (tmp_path / "run" / "samples.png").exists()


@pytest.mark.parametrize("values, message", [({"synthetic_size": 5}, "gives some of the 10 classes no image"),
                                             ({"synthetic_size": -1}, "must not be negative")])
def test_a_synthetic_set_that_cannot_be_drawn_is_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        build_config(None, values, {"mode": "none"}, dp_teacher=True).validate(10)


@pytest.mark.slow
def test_a_transcription_of_a_dp_teacher_learns_on_digits(dp_teacher: Path, tmp_path: Path):
    config = build_config(None, {"iterations": 100, "batch_size": 64, "replay_size": 4096, "eval_every": 100,
                                 "generator_width": (32, 16, 8), "student_arch": "cnn"}, {"mode": "none"},
                          dp_teacher=True)
    report = transcribe(dp_teacher, config, tmp_path / "run")
    # chance is 0.1; six transcriptions of three fresh teachers measured 0.24 to 0.29 at 40 iterations and 0.29 to
    # 0.39 at 150 (the teacher's secret noise differs each session)
    assert report["accuracy"]["student"] > 0.2


def test_a_dp_models_own_ledger_holds_the_release_it_is_and_its_free_students_inherit_it(dp_teacher: Path,
                                                                                          tmp_path: Path):
    stated = teacher_privacy(dp_teacher)
    own = ReleaseLedger(dp_teacher).own()
    assert own is not None and own.epsilon == pytest.approx(stated["epsilon_replace_one"])
    with pytest.raises(BudgetExceededError, match="already spent"):  # a total below what the model is: refused
        ReleaseLedger(dp_teacher).set_total(0.01)
    config = build_config(None, SMALL, {"mode": "none"}, dp_teacher=True)
    report = transcribe(dp_teacher, config, tmp_path / "run")
    assert ReleaseLedger(tmp_path / "run").own() == own  # the student is the teacher's release, no more
    shown = report["privacy"]["data_set_ledger"]  # the data the teacher's release read, shown, not charged again
    assert shown["data_set"] == "digits" and shown["spent_epsilon"] >= stated["epsilon_replace_one"] - 1e-9
    assert "data_set" not in json.dumps(json.loads((tmp_path / "run" / "report.json").read_text())["privacy"]
                                        .get("ledger", {}))  # and no digest anywhere public
    assert load_dataset("digits").digest not in (tmp_path / "run" / "report.json").read_text()


def describe(directory: Path, change) -> None:
    """Apply `change` to every description file of the teacher or student in `directory`."""
    for name in ("model.json", "meta.json", "student.json"):
        if (directory / name).exists():
            meta = json.loads((directory / name).read_text())
            change(meta)
            (directory / name).write_text(json.dumps(meta))


@pytest.mark.parametrize("drop_data_digest, refusal", [
    (True, "model.safetensors is not the model its provenance"),  # the weights are not the release's
    (False, "carries a DP provenance beside 'data_digest \\(private\\)'"),  # and a model trained without DP
])
def test_a_dp_provenance_pasted_onto_a_teacher_trained_without_dp_is_refused(
        digits_teacher: Path, dp_teacher: Path, tmp_path: Path, drop_data_digest: bool, refusal: str):
    teacher = Path(shutil.copytree(digits_teacher, tmp_path / "teacher"))
    pasted = json.loads((dp_teacher / "student.json").read_text())[PROVENANCE]

    def paste(meta: dict) -> None:
        meta[PROVENANCE] = pasted
        if drop_data_digest:
            meta.pop(DATA_DIGEST)

    describe(teacher, paste)
    before = (teacher / LEDGER_FILE).read_text() if (teacher / LEDGER_FILE).exists() else None
    with pytest.raises(CheckpointError, match=refusal):
        transcribe(teacher, build_config(None, SMALL, {"mode": "none"}, dp_teacher=True), tmp_path / "run")
    after = (teacher / LEDGER_FILE).read_text() if (teacher / LEDGER_FILE).exists() else None
    assert not (tmp_path / "run").exists() and after == before  # nothing recorded


def test_weights_swapped_under_a_dp_provenance_are_refused(dp_teacher: Path):
    weights = dp_teacher / "student.safetensors"
    save_file({key: value + 0.01 for key, value in load_file(weights).items()}, weights)
    with pytest.raises(CheckpointError, match="student.safetensors is not the model its provenance in .*student.json"):
        teacher_provenance(dp_teacher)


def test_a_provenance_or_report_edited_apart_is_refused(dp_teacher: Path, tmp_path: Path):
    alone = tmp_path / "alone"  # the student copied without its report: checked against its run's, where it is
    alone.mkdir()
    for name in ("student.safetensors", "student.json"):
        shutil.copy(dp_teacher / name, alone / name)
    assert teacher_provenance(alone).verified
    report = json.loads((dp_teacher / "report.json").read_text())
    report["privacy"]["epsilon"] /= 2
    (dp_teacher / "report.json").write_text(json.dumps(report))
    with pytest.raises(CheckpointError, match="report.json does not state the release the provenance"):
        teacher_provenance(dp_teacher)
    shutil.copy(alone / "student.json", dp_teacher / "student.json")
    report["privacy"]["epsilon"] *= 2
    (dp_teacher / "report.json").write_text(json.dumps(report))
    assert teacher_provenance(dp_teacher).verified  # as released again
    describe(dp_teacher, lambda meta: meta[PROVENANCE].update(epsilon=meta[PROVENANCE]["epsilon"] / 2))
    with pytest.raises(CheckpointError, match="report.json does not state the release"):
        teacher_provenance(dp_teacher)
    describe(dp_teacher, lambda meta: meta[PROVENANCE].update(epsilon=meta[PROVENANCE]["epsilon"] * 2,
                                                              report_sha256=None))
    with pytest.raises(CheckpointError, match="bound to no weights or no report"):
        teacher_provenance(dp_teacher)
    describe(dp_teacher, lambda meta: meta.pop(PROVENANCE))  # never silently a teacher trained without DP
    with pytest.raises(CheckpointError, match="carries no provenance, yet .*report.json states a DP release"):
        teacher_provenance(dp_teacher)


def test_a_note_on_settings_chosen_on_the_data_follows_it_by_digest_into_a_free_transcription(
        tmp_path: Path, monkeypatch):
    digits = load_dataset("digits")
    copy = tmp_path / "my-digits.npz"  # the same images and labels under another name and file
    np.savez(copy, x_train=((digits.x_train + 1) / 2).numpy(), y_train=digits.y_train.numpy(),
             x_test=((digits.x_test + 1) / 2).numpy(), y_test=digits.y_test.numpy(),
             declared_size=len(digits.y_train))
    assert load_dataset(str(copy)).digest == digits.digest
    chosen = Selection("these settings", {"student_arch": "scatter-linear", "epochs": 3}, "digits", digits.digest)
    monkeypatch.setattr(private, "SELECTED_ON_PRIVATE_DATA", (chosen,))
    note = "these settings were chosen on digits, which is this private data (same digest)"
    trained = train_private(PrivateTrainingConfig(dataset=str(copy), epsilon=2.0, student_arch="scatter-linear",
                                                  epochs=3), tmp_path / "dp")
    assert trained["privacy"][SELECTION][0].startswith(note)
    report = transcribe(tmp_path / "dp", build_config(None, SMALL, {"mode": "none"}, dp_teacher=True),
                        tmp_path / "run")
    own = trained["privacy"]["epsilon_replace_one"]  # free (the teacher's own release only): the note comes with it
    assert report["privacy"]["ledger"]["spent_epsilon"] == pytest.approx(own)
    assert report["privacy"][SELECTION][0].startswith(note)
    assert note in (tmp_path / "run" / "report.md").read_text()
    assert json.loads((tmp_path / "run" / "student.json").read_text())[PROVENANCE]["notes"][0].startswith(note)
