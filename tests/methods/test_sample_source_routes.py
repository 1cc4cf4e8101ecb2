"""The teacher routes with a sample source: PATE learns on its images and measures accuracy on the whole real test
split, a transcription asks about its images and trains no generator, and every run's epsilon is the sound
composition of the source's release and its answers, within --epsilon, as its teacher's ledger records it."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill.data.public import PUBLIC_POOL
from dpdistill.data.sample_source import load_sample_source
from dpdistill.errors import ConfigError, PrivacyParameterError
from dpdistill.methods.config import build_config
from dpdistill.methods.engine import TranscriptionEngine
from dpdistill.methods.pate import PateConfig
from dpdistill.models.ensemble import load_teacher
from dpdistill.pipeline import pate, transcribe
from dpdistill.privacy.ledger import LEDGER_FILE, Release, composed_epsilon, event_from_json
from helpers import TeacherReads, charged_queries, write_sample_source

BATCH, ITERATIONS = 16, 3


@pytest.fixture
def sample_source(tmp_path: Path) -> Path:
    """400 digits training images as the synthetic set: a stand-in for a good private generator."""
    digits = load_dataset("digits")
    return write_sample_source(tmp_path / "source", digits.x_train[:400].numpy(), digits.y_train[:400].numpy(),
                               noise_multiplier=4.0)


def _ledger_release(teacher_dir: Path, out_dir: Path) -> Release:
    entries = json.loads((teacher_dir / LEDGER_FILE).read_text())["entries"]
    (entry,) = [entry for entry in entries if entry["out_dir"] == str(out_dir.resolve())]
    return Release(event_from_json(entry["event"]), entry["delta"], entry["epsilon"], entry["discrete"])


def _source_release(directory: Path) -> Release:
    return load_sample_source(directory, (1, 8, 8), 10).release


def test_pate_learns_on_the_sample_source_and_measures_on_the_whole_test_split(digits_ensemble: Path, tmp_path: Path,
                                                                               sample_source: Path):
    config = PateConfig(epsilon=1e6, sigma=0.05, queries=200, sample_source=str(sample_source), min_steps=300,
                        self_training_rounds=0)
    report = pate(digits_ensemble, config, tmp_path / "run")
    assert report["accuracy"]["student"] > 0.5  # chance is 0.1
    assert "400 synthetic images" in report["public"] and "accuracy on the 360 test images of digits" in report["public"]
    meta = json.loads((tmp_path / "run" / "student.json").read_text())
    assert meta[PUBLIC_POOL]["split"] == "synthetic"  # `evaluate` leaves no test image out
    privacy = report["privacy"]
    assert privacy["sample_source"]["path"] == str(sample_source) and privacy["sample_source"]["method"] == "datalens"
    route = Release(event_from_json({"type": "SelfComposedDpEvent", "count": 200, "event": {
        "type": "GaussianDpEvent", "noise_multiplier": privacy["noise_multiplier"]}}), 1e-5, privacy["route_epsilon"],
        True)
    assert privacy["epsilon"] == composed_epsilon([route, _source_release(sample_source)], 1e-5) <= 1e6
    assert privacy["epsilon"] > privacy["route_epsilon"]
    assert _ledger_release(digits_ensemble, tmp_path / "run").epsilon == privacy["epsilon"]


def test_pate_asking_about_every_image_skips_self_training_on_an_empty_rest(digits_ensemble: Path, tmp_path: Path,
                                                                            sample_source: Path):
    """Self-training labels the images nobody asked about; when every image was asked, there are none."""
    config = PateConfig(epsilon=1e6, sigma=0.05, queries=400, sample_source=str(sample_source), min_steps=200,
                        epochs=1, self_training_rounds=2)
    report = pate(digits_ensemble, config, tmp_path / "run")
    assert report["accuracy"]["student"] > 0.3 and [record["round"] for record in report["history"]] == [1]


def test_pate_calibrates_its_votes_to_what_the_source_leaves(digits_ensemble: Path, tmp_path: Path,
                                                             sample_source: Path):
    alone = PateConfig(epsilon=2.0, queries=100, public_size=200).privacy_plan(4, 10)
    source = load_sample_source(sample_source, (1, 8, 8), 10)
    composed = PateConfig(epsilon=2.0, queries=100, sample_source=str(sample_source)).privacy_plan(
        4, 10, source.cost(2.0, 1e-5))
    assert composed.sigma > alone.sigma
    route = Release.of_plan(composed, 100)
    assert source.composed(route).epsilon == composed_epsilon([source.release, route], 1e-5) <= 2.0


@pytest.mark.parametrize("values, message", [
    ({"public": "mnist"}, "drop --public and --public-size"),
    ({"public_size": 300}, "drop --public and --public-size"),
    ({"queries": 401}, "holds 400: lower --queries"),
])
def test_pate_refuses_a_pool_beside_the_source_or_more_queries_than_its_images(digits_ensemble: Path, tmp_path: Path,
                                                                              sample_source: Path, values, message):
    with pytest.raises(ConfigError, match=message):
        pate(digits_ensemble, PateConfig(**{"epsilon": 1.0, "sample_source": str(sample_source), **values}),
             tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _config(sample_source: Path, mode: str = "data", **overrides):
    values = {"iterations": ITERATIONS, "batch_size": BATCH, "eval_every": ITERATIONS, "checkpoint_every": 100,
              "sample_source": str(sample_source)}
    return build_config("demo", values | overrides, {"mode": mode, "epsilon": 10.0})


@pytest.mark.parametrize("mode", ["data", "label"])
def test_a_transcription_asks_about_the_sources_images_only_and_trains_no_generator(
        digits_teacher: Path, tmp_path: Path, sample_source: Path, teacher_reads: TeacherReads, mode: str):
    report = transcribe(digits_teacher, _config(sample_source, mode), tmp_path / "run", "digits")
    assert teacher_reads.at_settle == charged_queries(digits_teacher, tmp_path / "run") == ITERATIONS * BATCH
    synthetic = {row.numpy().tobytes() for row in load_sample_source(sample_source, (1, 8, 8), 10).images}
    asked = torch.cat(teacher_reads.inputs)[:teacher_reads.at_settle]
    assert all(row.numpy().tobytes() in synthetic for row in asked)
    assert not any((tmp_path / "run" / name).exists() for name in ("generator.safetensors", "samples.png",
                                                                    "latents.safetensors"))
    assert "no generator was trained" in report["samples"]
    privacy = report["privacy"]
    ledger = _ledger_release(digits_teacher, tmp_path / "run")
    route = Release(ledger.event.events[0], 1e-5, privacy["route_epsilon"])  # the answers, then the source's release
    assert privacy["epsilon"] == composed_epsilon([route, _source_release(sample_source)], 1e-5) == ledger.epsilon
    assert privacy["route_epsilon"] < privacy["epsilon"] <= 10.0
    assert privacy["covered"].startswith("the student (post-processing of the sample source's release")


def test_the_engine_draws_its_batches_from_the_source_and_leaves_the_generator_as_initialised(
        digits_teacher: Path, sample_source: Path):
    teacher, meta = load_teacher(digits_teacher)
    engine = TranscriptionEngine(_config(sample_source), teacher, (1, 8, 8), 10)
    initial = {name: value.clone() for name, value in engine.generator.state_dict().items()}
    engine.run()
    assert all(torch.equal(initial[name], value) for name, value in engine.generator.state_dict().items())
    again = TranscriptionEngine(_config(sample_source), teacher, (1, 8, 8), 10)
    assert torch.equal(engine.draws, again.draws)  # seeded: a resumed run asks about the same images
    assert engine.draws.shape == (ITERATIONS, BATCH) and int(engine.draws.max()) < 400


@pytest.mark.parametrize("overrides, error, message", [
    ({"method": "srr"}, ConfigError, "srr cannot use generator pretraining"),
    ({"discriminator": "teacher"}, ConfigError, "the teacher as discriminator"),
])
def test_a_transcription_that_would_shape_the_generator_is_refused(digits_teacher: Path, tmp_path: Path,
                                                                   sample_source: Path, overrides, error, message):
    mode = "label" if overrides.get("method") == "srr" else "data"
    with pytest.raises(error, match=message):
        transcribe(digits_teacher, _config(sample_source, mode, **overrides), tmp_path / "run", "digits")
    assert not (tmp_path / "run").exists()


def test_paper_accounting_is_refused_with_a_source(digits_teacher: Path, tmp_path: Path, sample_source: Path):
    config = build_config("demo", {"sample_source": str(sample_source)},
                          {"mode": "data", "epsilon": 10.0, "accounting": "paper", "sigma": 100.0})
    with pytest.raises(PrivacyParameterError, match="sound accounting only"):
        transcribe(digits_teacher, config, tmp_path / "run", "digits")
