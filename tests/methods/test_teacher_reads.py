"""Every teacher read a run makes is charged: for each route, the examples the teacher (or ensemble) answered
until the run settled its release equal the queries its ledger.json recorded and its report states. A teacher
call the ledger never hears of fails here, whatever epsilon the report prints."""

from pathlib import Path

import pytest

from dpdistill.methods.config import build_config
from dpdistill.methods.pate import PateConfig
from dpdistill.pipeline import pate, transcribe
from helpers import TeacherReads, charged_queries

BATCH, ITERATIONS = 16, 3


def _transcribe(teacher: Path, out: Path, mode: str, **overrides) -> dict:
    values = {"iterations": ITERATIONS, "batch_size": BATCH, "eval_every": ITERATIONS, "checkpoint_every": 100}
    config = build_config("demo", values | overrides, {"mode": mode, "epsilon": 10.0})
    return transcribe(teacher, config, out, "digits")


@pytest.mark.parametrize("method, mode", [("dpsd", "data"), ("dpsd", "label"), ("dpdfd", "data")])
def test_every_answer_of_a_single_teacher_is_charged(digits_teacher: Path, tmp_path: Path,
                                                     teacher_reads: TeacherReads, method: str, mode: str):
    report = _transcribe(digits_teacher, tmp_path, mode, method=method)
    assert teacher_reads.at_settle == ITERATIONS * BATCH  # one read of each batch, no more
    assert teacher_reads.at_settle == charged_queries(digits_teacher, tmp_path) == report["privacy"]["queries"]


def test_srr_charges_every_answer_and_only_its_pretraining_reads_go_uncharged(digits_teacher: Path, tmp_path: Path,
                                                                              teacher_reads: TeacherReads):
    """SRR pretrains its generator on the teacher without noise (the report says: no formal guarantee); every
    other read is a randomized-response answer, charged."""
    pretraining = 2
    report = _transcribe(digits_teacher, tmp_path, "label", method="srr", generator_pretrain_steps=pretraining,
                         student_steps=1)
    charged = charged_queries(digits_teacher, tmp_path)
    assert charged == report["privacy"]["queries"] == ITERATIONS * BATCH
    assert teacher_reads.at_settle == charged + pretraining * BATCH
    assert report["privacy"]["covered"].startswith("NO formal guarantee")


@pytest.mark.parametrize("mode", ["data", "label"])
def test_every_answer_of_an_ensemble_is_charged_once_per_example(digits_ensemble: Path, tmp_path: Path,
                                                                 teacher_reads: TeacherReads, mode: str):
    report = _transcribe(digits_ensemble, tmp_path, mode)
    assert report["privacy"]["teachers"] == 4
    assert teacher_reads.at_settle == charged_queries(digits_ensemble, tmp_path) == report["privacy"]["queries"]
    assert teacher_reads.at_settle == ITERATIONS * BATCH


def test_every_pate_answer_is_charged(digits_ensemble: Path, tmp_path: Path, teacher_reads: TeacherReads):
    config = PateConfig(epsilon=5.0, queries=30, public_size=200, min_steps=5, epochs=1, self_training_rounds=0)
    report = pate(digits_ensemble, config, tmp_path)
    assert teacher_reads.at_settle == teacher_reads.examples == 30  # nothing read after the release either
    assert charged_queries(digits_ensemble, tmp_path) == report["privacy"]["queries"] == 30
