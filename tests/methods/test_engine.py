"""The data-free engine's options: replay buffer, schedules, BatchNorm and adversarial generator terms, --set."""

from collections import defaultdict
from pathlib import Path

import pytest
import torch

from dpdistill.errors import ConfigError
from dpdistill.methods.config import build_config
from dpdistill.methods.engine import ReplayBuffer, TranscriptionEngine
from dpdistill.models.checkpoint import load_classifier
from dpdistill.models.ensemble import load_teacher
from dpdistill.pipeline import coverage, transcribe


def test_replay_buffer_keeps_the_most_recent_samples():
    buffer = ReplayBuffer(capacity=5)
    for start in (0, 3, 6):
        images = torch.arange(start, start + 3, dtype=torch.float32).view(3, 1, 1, 1)
        buffer.add(images, torch.full((3, 2), float(start)))
    assert buffer.images.flatten().tolist() == [6, 7, 8, 3, 4]
    images, targets = buffer.sample(100)
    assert images.shape == (100, 1, 1, 1) and targets.shape == (100, 2)
    assert set(images.flatten().tolist()) <= {3.0, 4.0, 6.0, 7.0, 8.0}
    restored = ReplayBuffer(capacity=5)
    restored.restore(buffer.state())
    assert torch.equal(restored.images, buffer.images) and torch.equal(restored.targets, buffer.targets)


def test_no_privacy_defaults_to_the_upper_bound_engine_and_a_preset_overrides_it():
    engine = build_config(None, {}, {"mode": "none"})
    assert engine.discriminator == "teacher" and engine.adversarial_weight > 0 and engine.replay_size > 0
    faithful = build_config("paper", {}, {"mode": "none"})
    assert faithful.discriminator == "student" and faithful.adversarial_weight == 0
    private = build_config(None, {}, {"mode": "data", "epsilon": 1.0})
    assert not private.generator_sees_teacher


def test_the_adversarial_term_voids_the_guarantee():
    config = build_config(None, {"adversarial_weight": 0.5}, {"mode": "data", "epsilon": 1.0})
    assert coverage(config).startswith("NO formal guarantee")
    assert coverage(build_config(None, {}, {"mode": "data", "epsilon": 1.0})).startswith("the student")


@pytest.mark.parametrize("overrides, message", [
    ({"student_schedule": "linear"}, "schedule"),
    ({"replay_size": -1}, "replay-size"),
    ({"augment_shift": -2}, "augment-shift"),
    ({"candidates": "all"}, "candidate rule"),
    ({"candidate_threshold": 1.5}, "candidate-threshold"),
    ({"adversarial_weight": -1.0}, "adversarial-weight"),
    ({"generator_beta1": 1.0}, "beta1"),
])
def test_impossible_engine_settings_are_refused(digits_teacher: Path, tmp_path: Path, overrides, message):
    config = build_config("demo", overrides, {"mode": "none"})
    with pytest.raises(ConfigError, match=message):
        transcribe(digits_teacher, config, tmp_path, "digits")


def test_batchnorm_term_needs_a_discriminator_with_batchnorm(digits_teacher: Path, tmp_path: Path):
    config = build_config("demo", {"batchnorm_weight": 1.0, "discriminator": "student"}, {"mode": "none"})
    with pytest.raises(ConfigError, match="BatchNorm"):
        transcribe(digits_teacher, config, tmp_path, "digits")


@pytest.mark.slow
def test_upper_bound_engine_learns(digits_teacher: Path, tmp_path: Path):
    config = build_config(None, {"iterations": 120, "batch_size": 64, "replay_size": 2000, "eval_every": 60,
                                 "student_steps": 8}, {"mode": "none"})
    report = transcribe(digits_teacher, config, tmp_path, "digits")
    assert report["accuracy"]["student"] > 0.75  # measured 0.85 twice (no noise) on 2 cores: a margin of 0.1
    assert set(report["history"][-1]) >= {"g_batchnorm", "g_adversarial"}
    assert report["config"]["augment_shift"] == 2 and report["config"]["augment_flip"]  # relabelled by the teacher


def test_resume_is_exact_with_replay_augmentation_and_a_schedule(digits_teacher: Path, tmp_path: Path):
    values = {"iterations": 30, "batch_size": 32, "eval_every": 30, "checkpoint_every": 10, "replay_size": 200,
              "student_steps": 3, "student_schedule": "cosine", "augment_shift": 1, "augment_flip": True,
              "reproducible_noise": True}  # bit for bit only when the noise is (debugging only) reproducible
    whole = transcribe(digits_teacher, build_config("demo", values, {"mode": "label", "epsilon": 10.0}),
                       tmp_path / "whole", "digits")

    def interrupt(record: dict) -> None:
        if record["iteration"] == 25:
            raise KeyboardInterrupt

    config = build_config("demo", values, {"mode": "label", "epsilon": 10.0})
    with pytest.raises(KeyboardInterrupt):
        transcribe(digits_teacher, config, tmp_path / "cut", "digits", progress=interrupt)
    resumed = transcribe(digits_teacher, config, tmp_path / "cut", "digits", resume=True)
    assert resumed["privacy"]["queries"] == whole["privacy"]["queries"] == 30 * 32
    a, _ = load_classifier(tmp_path / "whole", "student")
    b, _ = load_classifier(tmp_path / "cut", "student")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_threshold_candidates_are_accounted_as_binary_randomized_response():
    """A threshold offers any number of candidates (at least two), so a label answer is bounded by binary
    randomized response, the worst case: the plan's epsilon is the exact binary composition of its eps0, above the
    figure the same eps0 would have over three candidates."""
    from dpdistill.privacy.budget import plan_privacy

    from helpers import exact_randomized_response_epsilon

    for candidates, expected_k in (("threshold", 2), ("top-k", 3)):
        config = build_config("demo", {"candidates": candidates, "iterations": 20, "batch_size": 64},
                              {"mode": "label", "epsilon": 1.0})
        plan = plan_privacy(config.privacy, 10, 64, 20)
        exact = exact_randomized_response_epsilon(plan.epsilon0, expected_k, 1280, 1e-5)
        assert plan.epsilon(1280) == pytest.approx(exact, rel=1e-4) and 0.999 < exact <= 1.0
        if expected_k == 2:
            assert exact_randomized_response_epsilon(plan.epsilon0, 3, 1280, 1e-5) < 0.999


def test_the_engine_initialises_student_and_generator_as_configured(digits_teacher: Path):
    teacher, meta = load_teacher(digits_teacher)
    biases = {}
    for init in ("default", "xavier"):
        config = build_config("demo", {"init": init}, {"mode": "data", "epsilon": 10.0})
        engine = TranscriptionEngine(config, teacher, tuple(meta["in_shape"]), 10)
        biases[init] = [module.bias for model in (engine.student, engine.generator) for module in model.modules()
                        if isinstance(module, torch.nn.Linear)]
    assert all((bias == 0).all() for bias in biases["xavier"])
    assert not any((bias == 0).all() for bias in biases["default"])


def test_a_target_moved_off_the_simplex_still_teaches_and_only_a_row_of_zeros_is_declined(digits_teacher: Path):
    """A probability-space target can sum to zero or less once noise moves it; only a row of zeros is declined."""
    teacher, meta = load_teacher(digits_teacher)
    config = build_config("demo", {"output_space": "probabilities", "iterations": 1, "batch_size": 4},
                          {"mode": "data", "epsilon": 10.0})
    engine = TranscriptionEngine(config, teacher, tuple(meta["in_shape"]), 10)
    answers = torch.full((4, 10), -0.1)
    answers[3] = 0  # the mechanism declined this one
    engine._annotate = lambda images, teacher_logits, student_logits: answers
    assert engine.step(defaultdict(float))["labelled"] == 0.75


@pytest.mark.parametrize("overrides, message", [
    ({"output_space": "odds"}, "output space"),
    ({"init": "orthogonal"}, "initialisation"),
    ({"output_space": "probabilities", "temperature": 4.0}, "temperature 1"),
])
def test_a_reading_that_is_not_one_is_refused(overrides: dict, message: str):
    with pytest.raises(ConfigError, match=message):
        build_config(None, overrides, {"mode": "data", "epsilon": 1.0}).validate(10)
