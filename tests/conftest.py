"""Shared fixtures: one small digits teacher per test session (trained once, about 10 seconds)."""

from pathlib import Path

import pytest
import torch

from dpdistill.pipeline import train_teacher
from dpdistill.training.teacher import TeacherConfig
from helpers import TeacherReads, counting_teacher_reads


@pytest.fixture(scope="session", autouse=True)
def _two_threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def digits_teacher(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("teacher")
    report = train_teacher("digits", directory, TeacherConfig(arch="cnn", epochs=6, batch_size=64))
    assert report["accuracy"]["teacher"] > 0.9
    return directory


@pytest.fixture(scope="session")
def digits_ensemble(tmp_path_factory) -> Path:
    """Four cnn teachers on disjoint IID quarters of the digits training split (a few seconds)."""
    from dpdistill.pipeline import train_teacher_ensemble

    directory = tmp_path_factory.mktemp("ensemble")
    train_teacher_ensemble("digits", directory, TeacherConfig(arch="cnn", epochs=1, batch_size=64, min_steps=60), 4)
    return directory


@pytest.fixture(scope="session")
def digits_encoder(tmp_path_factory) -> Path:
    """A cnn encoder pretrained briefly on the digits public pool (the first 200 test images)."""
    from dpdistill.pipeline import pretrain
    from dpdistill.training.self_supervised import ContrastiveConfig

    directory = tmp_path_factory.mktemp("encoder")
    pretrain("digits", None, 200, ContrastiveConfig(steps=5, batch_size=32), directory)
    return directory


@pytest.fixture
def teacher_reads(monkeypatch) -> TeacherReads:
    """Every read of the teacher (or ensemble) the next pipeline run loads, and the count when it settled."""
    return counting_teacher_reads(monkeypatch)
