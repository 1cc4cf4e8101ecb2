"""`dpdistill release` as a run a user can follow: each phase named, with its own count."""

import json
from pathlib import Path

import pytest

from dpdistill.errors import ConfigError

from dpdistill.methods.release import (TEACHER_PHASE, TRANSCRIPTION_PHASE, ReleaseConfig, ReleaseJob, TeacherGuided,
                                      build_release_config, run_release)
from dpdistill.methods.synthetic import CLASSIFIER_PHASE, SYNTHETIC_PHASE
from dpdistill.methods.transcription import FIDELITY_PHASE
from dpdistill.reporting.transcription import WITH_TEACHER
from dpdistill.training.feature_statistics import PHASE as STATISTICS_PHASE

SMALL = {"batch_size": 32, "student_steps": 2, "replay_size": 256, "generator_width": (16, 8, 4), "eval_every": 2,
         "iterations": 2, "synthetic_epochs": 1}


@pytest.mark.slow
def test_every_record_of_a_release_names_its_phase_and_each_phase_counts_to_its_own_total(tmp_path: Path):
    records: list[dict] = []
    config = build_release_config("digits", 2.0, synthetic_size=100, teacher_options={"epochs": 3},
                                  transcription_options=SMALL)
    report = run_release(config, tmp_path, progress=records.append)
    phases = list(dict.fromkeys(record.get("phase") for record in records))
    main = [phase for phase in phases if ": " not in phase]  # nested passes: "DP teacher (DP-SGD): features"
    assert main == [TEACHER_PHASE, STATISTICS_PHASE, TRANSCRIPTION_PHASE, SYNTHETIC_PHASE, CLASSIFIER_PHASE]
    assert set(phases) - set(main) <= {f"{TEACHER_PHASE}: features", f"{FIDELITY_PHASE}: features"}
    assert f"{FIDELITY_PHASE}: features" in phases  # the feature passes after the classifier are not a silence
    totals = {phase: {record.get("total") for record in records if record["phase"] == phase} for phase in main}
    assert totals == {TEACHER_PHASE: {3}, STATISTICS_PHASE: {1437}, TRANSCRIPTION_PHASE: {2}, SYNTHETIC_PHASE: {100},
                      CLASSIFIER_PHASE: {1}}
    drawn = [record["done"] for record in records if record["phase"] == SYNTHETIC_PHASE]
    assert drawn[0] == 0 and drawn[-1] == report["synthetic"]["images"]  # a class the generator misses ends short
    markdown = (tmp_path / "report.md").read_text()
    engine = markdown.split("## Data-free engine")[1].split("##")[0]
    assert "| discriminator | student |" in engine and "| replay_size | 256 |" in engine  # its transcription's
    assert "n/a" not in markdown and "none privacy" not in markdown  # a figure it cannot know is left out
    assert "Titles are the synthetic set's labels: the argmax of the teacher" in markdown
    assert "| budget (as requested: the DP teacher's and its statistics) | 2 |" in markdown
    private = json.loads((tmp_path / "private" / "record.json").read_text())["timing"]
    assert private[WITH_TEACHER] > report["timing"]["wall_seconds"] and report["resumed"] is False


@pytest.mark.slow
def test_a_release_stopped_in_its_last_phase_resumes_there(tmp_path: Path, monkeypatch):
    """Stopped while the classifier on its synthetic set trains (saved after every batch here): the resumed
    release neither transcribes nor draws its synthetic set again, and its classifier continues."""
    from dpdistill.training import state

    monkeypatch.setattr(state, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(state, "SAVE_SHARE", float("inf"))
    config = build_release_config("digits", 2.0, synthetic_size=300, teacher_options={"epochs": 3},
                                  transcription_options={**SMALL, "synthetic_epochs": 2})

    def stop_after_the_first_epoch(record: dict) -> None:
        if record.get("phase") == CLASSIFIER_PHASE and record["epoch"] == 1 and "train_loss" in record:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_release(config, tmp_path, progress=stop_after_the_first_epoch)
    records: list[dict] = []
    report = run_release(None, tmp_path, resume=True, progress=records.append)
    assert {record["phase"] for record in records} == {CLASSIFIER_PHASE, f"{FIDELITY_PHASE}: features"}
    assert min(record["epoch"] for record in records if record["phase"] == CLASSIFIER_PHASE) == 1
    assert len(report["synthetic"]["per_class"]) == 10 and (tmp_path / "synthetic.npz").exists()
    assert WITH_TEACHER not in report["timing"] and report["resumed"]  # a whole time no report holds


@pytest.mark.slow
def test_a_release_spends_its_budget_on_the_teacher_and_its_statistics_together_and_records_both(tmp_path: Path):
    from dpdistill.training.feature_statistics import STATISTICS_METHOD
    from dpdistill.privacy.ledger import ReleaseLedger
    from dpdistill.privacy.provenance import Provenance
    from dpdistill.models.checkpoint import load_classifier

    config = build_release_config("digits", 2.0, synthetic_size=0, teacher_options={"epochs": 3},
                                  transcription_options=SMALL, statistics_clip="auto")  # its bound drawn too
    assert config.teacher.epsilon == pytest.approx(1.8) and config.statistics_epsilon == pytest.approx(0.2)
    assert config.statistics_share == 0.1
    report = run_release(config, tmp_path)
    privacy, statistics = report["privacy"], report["statistics"]
    assert (tmp_path / "teacher" / "statistics.safetensors").exists()
    assert statistics["resolution"] == 8  # the default 14 cells a side, capped at the 8 x 8 images' pixels
    assert statistics["clip"] == pytest.approx(1.25 * statistics["norm_median"]) and statistics["norm_share"] == 0.05
    assert f"bounded at {statistics['clip']:.3g} (1.25 times their noisy median" in (tmp_path / "report.md").read_text()
    assert any("g_class_statistics" in record for record in report["history"])  # the generator matched the classes
    notes = " ".join(privacy["selection"])  # choices made on the two sets, said as fixed public ones for digits
    assert "14 x 14 cells and share of 0.1 were chosen on the MNIST set" in notes and "cnn's DP-SGD schedule" in notes
    assert "14 x 14 cells and share of 0.1 were chosen on Fashion-MNIST" in notes
    assert "a fixed public choice for this data" in notes and "no epsilon here covers" not in notes
    teacher = json.loads((tmp_path / "teacher" / "report.json").read_text())["privacy"]
    assert statistics["epsilon_add_remove"] <= 0.2 and teacher["epsilon"] <= 1.8
    assert privacy["epsilon"] == pytest.approx(teacher["epsilon"] + statistics["epsilon_add_remove"])
    assert privacy["epsilon"] <= 2.0
    assert privacy["delta"] == pytest.approx(1e-5) and "released feature statistics" in privacy["covered"]
    entries = {entry.method: entry for entry in ReleaseLedger(tmp_path / "teacher").read().entries}
    assert entries[STATISTICS_METHOD].release.epsilon == pytest.approx(statistics["epsilon_replace_one"])
    own = ReleaseLedger(tmp_path).own()  # the student's release: the teacher's and the statistics', replace-one
    assert own.epsilon == pytest.approx(teacher["epsilon_replace_one"] + statistics["epsilon_replace_one"])
    _, meta = load_classifier(tmp_path, "student")
    assert Provenance.of_meta(meta).epsilon == pytest.approx(privacy["epsilon"])
    # statistics the teacher's ledger does not record (here: relabelled as noisier) are refused; without noise
    # they are read as what they are, with no guarantee
    from dpdistill.methods.transcription import released_statistics
    from dpdistill.training.feature_statistics import StatisticsPlan, load_statistics, save_statistics

    path = tmp_path / "teacher" / "statistics.safetensors"
    kept, figures = load_statistics(path)
    assert kept.classes[0].shape == (10, 64)  # each class's images at 8 x 8 cells
    _, teacher_meta = load_classifier(tmp_path / "teacher", "student")
    teacher_provenance = Provenance.of_meta(teacher_meta)
    save_statistics(path, kept, StatisticsPlan(2 * figures["noise_multiplier"], figures["delta"]).figures())
    with pytest.raises(ConfigError, match="not the release"):
        released_statistics(tmp_path / "teacher", config.transcription, teacher_provenance)
    save_statistics(path, kept, {**figures, "noise_multiplier": 0.0})
    assert released_statistics(tmp_path / "teacher", config.transcription, teacher_provenance).provenance is None


def test_a_release_without_a_statistics_share_matches_none(tmp_path: Path):
    config = build_release_config("digits", 2.0, statistics_share=0.0)
    assert (config.teacher.epsilon, config.statistics_epsilon, config.transcription.statistics_weight,
            config.statistics_resolution) == (2.0, 0, 0, 0)
    assert build_release_config("digits", 2.0, statistics_resolution=0).statistics_resolution == 0
    # the release's longer loop, unless the user names a preset or the knobs themselves
    assert (config.transcription.iterations, config.transcription.student_steps) == (600, 8)
    assert build_release_config("digits", 2.0, preset="dp-teacher").transcription.iterations == 300
    assert build_release_config("digits", 2.0, transcription_options={"iterations": 5}).transcription.iterations == 5
    with pytest.raises(ConfigError, match="statistics-share"):
        build_release_config("digits", 2.0, statistics_share=0.5)
    with pytest.raises(ConfigError, match="statistics-resolution"):
        build_release_config("digits", 2.0, statistics_resolution=-1)
    for wrong in (0.0, "nan", "inf", "twenty", None):
        with pytest.raises(ConfigError, match="statistics-clip must be a positive number or auto, got"):
            build_release_config("digits", 2.0, statistics_clip=wrong)
    assert build_release_config("digits", 2.0, statistics_clip="40").statistics_clip == 40.0  # the command line's
    chosen = build_release_config("digits", 2.0, statistics_clip="auto")
    assert chosen.statistics_clip is None and ReleaseConfig.from_dict(chosen.to_dict()).statistics_clip is None
    larger = build_release_config("digits", 2.0, statistics_clip=40.0)  # kept with the run, for --resume
    assert ReleaseConfig.from_dict(larger.to_dict()).statistics_clip == 40.0 and config.statistics_clip is None
    saved_before = {key: value for key, value in larger.to_dict().items() if key != "statistics_clip"}
    assert ReleaseConfig.from_dict(saved_before).statistics_clip == 20.0  # saved when the bound was fixed
    # the cnn teacher's 10-epoch schedule; any other teacher's train-private defaults
    assert (config.teacher.student_arch, config.teacher.epochs, config.teacher.batch_size) == ("cnn", 10, 1024)
    assert build_release_config("digits", 2.0, teacher_arch="scatter-linear").teacher.epochs != 10
    assert ReleaseJob(larger, tmp_path, None).statistics.clip == 40.0  # the release's plan bounds them there


def test_the_teacher_guided_synthesiser_configures_the_release_under_replace_one():
    """synthesize's options reach the release: --steps its iterations, a knob set to False kept as given, the
    budget calibrated under replace-one; an option of DataLens refused, naming where the teacher's settings are."""
    config = TeacherGuided().build_config(None, {"dataset": "digits", "epsilon": 1.0, "steps": 5, "teachers": None,
                                                 "augment_flip": False, "synthetic_size": 300})
    assert (config.transcription.iterations, config.transcription.augment_flip) == (5, False)
    assert config.teacher.relation == "replace-one" and config.transcription.synthetic_size == 300
    assert config.statistics_epsilon + config.teacher.epsilon == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="teachers: not a teacher-guided setting.*release"):
        TeacherGuided().build_config(None, {"dataset": "digits", "epsilon": 1.0, "teachers": 10})
    with pytest.raises(ConfigError, match="needs --dataset and --epsilon"):
        TeacherGuided().build_config(None, {"dataset": "digits"})
