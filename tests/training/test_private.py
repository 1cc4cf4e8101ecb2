"""Private-training baselines: accounting cross-checked against Opacus, tiny runs that learn within their budget,
runs that resume exactly, and refusals before any training."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch
import torch.nn.functional as F
from opacus.accountants import PRVAccountant, RDPAccountant
from safetensors.torch import load_file

from dpdistill.data import load_dataset
from dpdistill.data.public import public_split
from dpdistill.errors import BudgetExceededError, ConfigError, PrivacyParameterError
from dpdistill.evaluation.metrics import accuracy
from dpdistill.models.checkpoint import load_classifier
from dpdistill.reporting.report import as_written
from dpdistill.training.annotation import DistillationGradient
from dpdistill.jobs import evaluate
from dpdistill.pipeline import train_private
from dpdistill.runs import exclusive
from dpdistill.privacy.accounting import (GaussianQuery, SampledGaussianQuery, SampledReleaseQuery, calibrate,
                                          composed_epsilon, dpsgd_epsilon)
from dpdistill.privacy.count import NoisyCount
from dpdistill.privacy.ledger import event_to_json
from dpdistill.training import private
from dpdistill.training.private import (DPSGDTrainer, PoissonBatchSampler, PrivateTrainingConfig, calibrate_dpsgd,
                                       label_logits, plan_private_training)

from helpers import assert_confusion_matches_accuracy, gdp_delta

DELTA = 1e-5
DIGITS_TRAIN = 1437
TINY = {"dataset": "digits", "student_arch": "datalens", "batch_size": 64, "lr": 3e-3}  # 23 Poisson batches an epoch


def _opacus_epsilon(accountant, noise_multiplier: float, sample_rate: float, steps: int) -> float:
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return accountant.get_epsilon(DELTA)


@pytest.mark.parametrize("sample_rate, noise_multiplier, steps", [(256 / 60000, 1.1, 14062), (1 / 23, 0.9, 230),
                                                                  (0.01, 2.0, 1000)])
def test_private_dpsgd_accounting_matches_opacus(sample_rate, noise_multiplier, steps):
    rdp = dpsgd_epsilon(noise_multiplier, sample_rate, steps, DELTA, "rdp")
    pld = dpsgd_epsilon(noise_multiplier, sample_rate, steps, DELTA)
    assert rdp == pytest.approx(_opacus_epsilon(RDPAccountant(), noise_multiplier, sample_rate, steps), rel=0.01)
    # Opacus' PRV figure is an upper bound within its eps_error (0.01) of its estimate
    assert pld == pytest.approx(_opacus_epsilon(PRVAccountant(), noise_multiplier, sample_rate, steps), abs=0.015)
    assert pld < rdp  # PLD is the tighter analysis of the same mechanism


def test_private_dpsgd_accounting_reproduces_the_privacy_note():
    assert dpsgd_epsilon(1.1, 256 / 60000, 14062, DELTA, "rdp") == pytest.approx(2.597, abs=1e-3)
    assert dpsgd_epsilon(1.1, 256 / 60000, 14062, DELTA) == pytest.approx(2.382, abs=1e-3)


def test_private_dpsgd_accounting_under_replace_one_costs_more():
    """The same noise under replace-one neighbours (the clipped sum moves by up to twice the clipping norm)."""
    assert dpsgd_epsilon(1.0, 256 / 60000, 2340, DELTA) == pytest.approx(1.10, abs=0.005)
    assert dpsgd_epsilon(1.0, 256 / 60000, 2340, DELTA, relation="replace-one") == pytest.approx(1.76, abs=0.005)
    with pytest.raises(PrivacyParameterError, match="only for add/remove"):
        dpsgd_epsilon(1.0, 256 / 60000, 2340, DELTA, "rdp", relation="replace-one")
    with pytest.raises(PrivacyParameterError, match="unknown neighbouring relation 'sideways'"):
        dpsgd_epsilon(1.0, 256 / 60000, 2340, DELTA, relation="sideways")


def test_private_dpsgd_calibration_spends_the_budget_and_no_more():
    query = plan_private_training(PrivateTrainingConfig(**TINY, epsilon=10.0, epochs=10), DIGITS_TRAIN).query
    assert query.discretization == 1e-4  # searched on a coarse PLD, stated on the fine one
    assert 9.9 < composed_epsilon(query, 230, DELTA) <= 10.0
    assert dpsgd_epsilon(query.noise_multiplier / 1.003, 1 / 23, 230, DELTA) > 10.0  # within 0.3% of the optimum


def test_private_dpsgd_calibration_from_a_rough_guess_is_the_plain_searchs_grid_point():
    """The rough PLD only says where to start: the answer is the grid point a search from 1.0 on the coarse PLD finds,
    the least noise on the grid that fits (the same held for 36 plans of both relations, 23 to 1000 steps and
    epsilon 1 to 100)."""
    coarse = lambda z: SampledGaussianQuery(z, 1 / 23, 1e-3, "replace-one")  # noqa: E731
    plain = calibrate(coarse, 23, 1.0, DELTA, tolerance=1e-3)
    assert calibrate_dpsgd(1 / 23, 23, 1.0, DELTA, "replace-one").noise_multiplier == plain.noise_multiplier
    less = coarse(plain.noise_multiplier / 1.001)  # the grid point below
    assert composed_epsilon(plain, 23, DELTA) <= 1.0 < composed_epsilon(less, 23, DELTA)


def test_private_release_accounting_is_the_gaussian_mixture_over_participations():
    every_step = composed_epsilon(GaussianQuery(2.0), 230, DELTA)
    assert composed_epsilon(SampledReleaseQuery(2.0, 1.0), 230, DELTA) == pytest.approx(every_step, rel=1e-6)
    sampled = composed_epsilon(SampledReleaseQuery(2.0, 1 / 23), 230, DELTA)
    # Visible participation forgoes amplification: above DP-SGD's figure for the same noise, below every step.
    assert dpsgd_epsilon(2.0, 1 / 23, 230, DELTA) < sampled < every_step


def test_private_release_epsilon_agrees_with_a_monte_carlo_privacy_loss():
    """delta(eps) = E[(1 - exp(eps - L))+] with L the summed Gaussian losses of the steps the example took part in."""
    noise_multiplier, sample_rate, steps, delta = 3.0, 0.05, 200, 1e-2
    epsilon = composed_epsilon(SampledReleaseQuery(noise_multiplier, sample_rate), steps, delta)
    rng = np.random.default_rng(0)
    taking_part = rng.binomial(steps, sample_rate, size=2_000_000)
    mu_squared = taking_part / noise_multiplier**2
    loss = rng.normal(mu_squared / 2, np.sqrt(mu_squared))
    estimate = np.maximum(1 - np.exp(epsilon - loss), 0).mean()
    assert estimate == pytest.approx(delta, rel=0.03)


def test_private_release_calibration_fits_the_budget():
    config = PrivateTrainingConfig(**TINY, method="dpdfd-direct", epsilon=10.0, epochs=10)
    query = plan_private_training(config, DIGITS_TRAIN).query
    assert 9.9 < composed_epsilon(query, 230, DELTA) <= 10.0
    assert composed_epsilon(SampledReleaseQuery(query.noise_multiplier / 1.003, 1 / 23), 230, DELTA) > 10.0


def test_private_label_teacher_gives_the_cross_entropy_gradient():
    logits = torch.randn(6, 10)
    labels = torch.randint(0, 10, (6,))
    gradient = DistillationGradient(loss="kd")(label_logits(labels, 10), logits)
    leaf = logits.clone().requires_grad_(True)
    F.cross_entropy(leaf, labels, reduction="sum").backward()
    assert torch.allclose(gradient, leaf.grad, atol=1e-6)


def test_private_plan_follows_opacus_sampling_rule():
    plan = plan_private_training(PrivateTrainingConfig(**TINY, epsilon=10.0, sigma=1.0, epochs=3), DIGITS_TRAIN)
    assert (plan.sample_rate, plan.steps_per_epoch, plan.steps) == (1 / 23, 23, 69)
    assert plan.noise_multiplier == 1.0
    direct = plan_private_training(PrivateTrainingConfig(**TINY, method="dpdfd-direct", epsilon=50.0, sigma=3.0,
                                                         epochs=3), DIGITS_TRAIN)
    assert direct.noise_multiplier == 1.5  # answers of norm <= beta differ by 2 beta, noise std sigma * beta


@pytest.mark.parametrize("method", ["dpsgd", "dpdfd-direct"])
def test_private_plan_refuses_an_explicit_sigma_that_overspends(method):
    config = PrivateTrainingConfig(**TINY, method=method, epsilon=1.0, sigma=0.5, epochs=10)
    with pytest.raises(BudgetExceededError, match="> budget 1.0"):
        plan_private_training(config, DIGITS_TRAIN)


@pytest.mark.parametrize("values, error, message", [
    ({"method": "magic"}, ConfigError, "unknown method 'magic'"),
    ({"epsilon": 0.0}, PrivacyParameterError, "epsilon must be positive"),
    ({"epsilon": None}, PrivacyParameterError, "--epsilon is required"),
    ({"delta": 1.0}, PrivacyParameterError, "delta must be in"),
    ({"sigma": -1.0}, PrivacyParameterError, "sigma must be positive"),
    ({"beta": 0.0}, ConfigError, "beta must be positive"),
    ({"epochs": 0}, ConfigError, "at least 1"),
    ({"train_layers": "middle"}, ConfigError, "unknown --train-layers 'middle'"),
    ({"train_layers": "head"}, ConfigError, "give the encoder with --student-init"),
    ({"relation": "sideways"}, ConfigError, "unknown --relation 'sideways'"),
    ({"ema_decay": 1.0}, ConfigError, "--ema-decay must be in"),
])
def test_private_config_refuses_impossible_settings(values, error, message):
    with pytest.raises(error, match=message):
        PrivateTrainingConfig(**{**TINY, "epsilon": 1.0, **values})


def test_private_resume_with_nothing_to_resume(tmp_path: Path):
    with pytest.raises(ConfigError, match="nothing to resume"):
        train_private(None, tmp_path, resume=True)


def test_private_refuses_a_second_writer(tmp_path: Path):
    with exclusive(tmp_path), pytest.raises(ConfigError, match="another dpdistill run"):
        train_private(PrivateTrainingConfig(**TINY, epsilon=10.0), tmp_path)


@pytest.mark.slow
def test_private_dpsgd_learns_within_its_budget(tmp_path: Path):
    report = train_private(PrivateTrainingConfig(**TINY, epsilon=10.0, epochs=5), tmp_path)
    privacy = report["privacy"]
    assert 9.9 < privacy["epsilon"] <= 10.0 and privacy["delta"] == DELTA  # calibrated: spends the budget
    assert privacy["steps"] == privacy["planned_steps"] == 5 * 23 and privacy["sample_rate"] == 1 / 23
    assert privacy["noise_multiplier"] > 0
    assert privacy["epsilon"] < privacy["epsilon_rdp"] == pytest.approx(privacy["epsilon_opacus"], rel=0.01)
    assert privacy["covered"] == "the student (DP-SGD: every update is a clipped, noised per-example gradient)"
    assert privacy["relation"] == "add-remove" and privacy["epsilon_add_remove"] == privacy["epsilon"]
    assert privacy["epsilon"] < privacy["epsilon_replace_one"]  # the same noise under replace-one
    assert report["accuracy"]["student"] > 0.5  # chance is 0.1
    assert_confusion_matches_accuracy(report, tmp_path, 10)
    assert json.loads((tmp_path / "report.json").read_text())["privacy"] == as_written(privacy)
    assert "-DP** with respect to adding or removing one private training example" in (tmp_path / "report.md").read_text()
    assert evaluate(tmp_path, "digits", "student")["accuracy"] == pytest.approx(report["accuracy"]["student"])
    assert not (tmp_path / "private" / "resume").exists()


@pytest.mark.slow
def test_private_dpdfd_direct_learns_but_has_no_formal_guarantee(tmp_path: Path):
    report = train_private(PrivateTrainingConfig(**TINY, method="dpdfd-direct", epsilon=50.0, epochs=3), tmp_path)
    privacy = report["privacy"]
    # secret noise: 17 runs on 2 cores gave 0.739-0.925 (chance 0.10), so the bound sits far below the lowest
    assert report["accuracy"]["student"] > 0.5
    assert privacy["formal_guarantee"] is False and privacy["covered"].startswith("NO formal guarantee")
    assert 49.5 < privacy["epsilon"] <= 50.0 and privacy["steps"] == 69
    # independently: each example takes part in K ~ Binomial(69, 1/23) steps, each a Gaussian of the reported
    # multiplier, so delta(eps) is the Binomial mixture of closed-form GDP curves with mu = sqrt(K) / multiplier
    takes_part = np.arange(1, 70)
    weights = scipy.stats.binom.pmf(takes_part, 69, 1 / 23)
    mixture = sum(w * gdp_delta(privacy["epsilon"], math.sqrt(k) / privacy["noise_multiplier"])
                  for w, k in zip(weights, takes_part))
    assert mixture == pytest.approx(DELTA, rel=1e-3)
    assert privacy["relation"] == "replace-one" and privacy["epsilon_replace_one"] == privacy["epsilon"]
    assert "epsilon_add_remove" not in privacy  # releases tied to their examples: add/remove is not meaningful
    record = json.loads((tmp_path / "private" / "record.json").read_text())  # the count reveals the data's size
    assert "releases" not in privacy and math.isclose(record["releases"], 69 * DIGITS_TRAIN / 23, rel_tol=0.1)
    assert "**NO formal guarantee" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_private_resume_ends_where_an_uninterrupted_run_ends(tmp_path: Path):
    """In the debug mode, whose noise stream the checkpoint keeps (a secure run draws afresh on resuming)."""
    config = PrivateTrainingConfig(**TINY, epsilon=10.0, sigma=1.0, epochs=2, reproducible_noise=True)
    whole = train_private(config, tmp_path / "whole")

    def interrupt_after_first_epoch(record: dict) -> None:
        if "test_accuracy" in record:  # the epoch's end (records within it say how far into it the run is)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_private(config, tmp_path / "cut", progress=interrupt_after_first_epoch)
    assert (tmp_path / "cut" / "private" / "resume").exists() and not (tmp_path / "cut" / "report.json").exists()
    with pytest.raises(ConfigError, match="unfinished run"):
        train_private(config, tmp_path / "cut")
    resumed = train_private(None, tmp_path / "cut", resume=True)
    def own(privacy: dict) -> dict:  # the data set's ledger counts both runs: the rest is the run's own
        return {key: value for key, value in privacy.items() if key != "data_set_ledger"}

    assert own(resumed["privacy"]) == own(whole["privacy"])  # same steps, same Opacus accountant history
    assert resumed["history"] == whole["history"]
    weights, again = load_file(tmp_path / "whole" / "student.safetensors"), load_file(tmp_path / "cut" / "student.safetensors")
    assert all(torch.equal(weights[name], again[name]) for name in weights)


@pytest.mark.slow
def test_private_dpsgd_fixes_batchnorm_and_the_student_loads(tmp_path: Path):
    report = train_private(PrivateTrainingConfig(**{**TINY, "student_arch": "cnn"}, epsilon=10.0, sigma=1.0, epochs=1),
                           tmp_path)
    assert report["notes"] and all("BatchNorm2d -> GroupNorm" in note for note in report["notes"])
    assert json.loads((tmp_path / "student.json").read_text())["opacus_fixed"] is True
    assert evaluate(tmp_path, "digits", "student")["accuracy"] == pytest.approx(report["accuracy"]["student"])


def _frozen_weights(model_state: dict, encoder_state: dict, prefix: str) -> bool:
    return all(torch.equal(model_state[name], tensor) for name, tensor in encoder_state.items() if name.startswith(prefix))


@pytest.mark.slow
def test_private_linear_probe_learns_only_the_head_of_the_public_encoder(tmp_path: Path, digits_encoder: Path):
    config = PrivateTrainingConfig(**{**TINY, "student_arch": "cnn"}, epsilon=10.0, epochs=5,
                                   student_init=str(digits_encoder), train_layers="head", public_size=200)
    report = train_private(config, tmp_path)
    encoder = load_file(digits_encoder / "encoder.safetensors")
    student = load_file(tmp_path / "student.safetensors")
    assert _frozen_weights(student, encoder, "backbone.")  # BatchNorm statistics included
    assert not torch.equal(student["head.weight"], encoder["head.weight"])
    assert report["accuracy"]["student"] > 0.5  # chance is 0.1
    measured_on = "the last 160 test images of digits, outside the public pool (its first 200 test images)"
    assert report["measured_on"] == measured_on
    assert f"Accuracy is measured on {measured_on}." in (tmp_path / "report.md").read_text()
    digits = load_dataset("digits")
    model, _ = load_classifier(tmp_path, "student")
    assert accuracy(model, digits.x_test[200:], digits.y_test[200:]) == pytest.approx(report["accuracy"]["student"])
    assert evaluate(tmp_path, "digits")["accuracy"] == pytest.approx(report["accuracy"]["student"])  # on the same 160
    privacy = report["privacy"]
    assert privacy["epsilon"] <= 10.0 and privacy["covered"].endswith("its starting encoder saw public images only")
    assert "only its last layer learns" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_private_training_from_the_encoder_keeps_its_batchnorm_statistics(tmp_path: Path, digits_encoder: Path):
    config = PrivateTrainingConfig(**{**TINY, "student_arch": "cnn"}, epsilon=10.0, sigma=1.0, epochs=1,
                                   student_init=str(digits_encoder), public_size=200)
    report = train_private(config, tmp_path)
    encoder = load_file(digits_encoder / "encoder.safetensors")
    student = load_file(tmp_path / "student.safetensors")
    batchnorm = [name for name in encoder if "running_mean" in name]
    assert batchnorm and all(torch.equal(student[name], encoder[name]) for name in batchnorm)
    for name in batchnorm:  # "backbone.{i}.running_mean": BatchNorm i keeps scale and shift, convolution i - 1 learns
        index = int(name.split(".")[1])
        assert torch.equal(student[f"backbone.{index}.weight"], encoder[f"backbone.{index}.weight"])
        assert not torch.equal(student[f"backbone.{index - 1}.weight"], encoder[f"backbone.{index - 1}.weight"])
    assert report["notes"] == [] and json.loads((tmp_path / "student.json").read_text())["opacus_fixed"] is False


def test_private_report_says_which_test_images_measure_accuracy(tmp_path: Path):
    """The whole test split without a public pool; with one, the test images it leaves, or the whole split when
    the pool comes from another data set's training images."""
    report = train_private(PrivateTrainingConfig(**TINY, epsilon=10.0, sigma=1.0, epochs=1), tmp_path / "run")
    assert report["measured_on"] == "the whole test split of digits (360 images)"
    assert "Accuracy is measured on the whole test split of digits (360 images)." in \
        (tmp_path / "run" / "report.md").read_text()
    digits = load_dataset("digits")
    assert public_split(digits, None, 200).measured_on == ("the last 160 test images of digits, outside the public "
                                                           "pool (its first 200 test images)")
    other = tmp_path / "public.npz"
    np.savez(other, x_train=np.zeros((300, 8, 8), dtype=np.uint8), y_train=np.arange(300) % 2,
             x_test=np.zeros((10, 8, 8), dtype=np.uint8), y_test=np.arange(10) % 2)
    assert public_split(digits, str(other), 250).measured_on == ("the whole test split of digits (360 images); the "
                                                                 "public pool is public's first 250 training images")


def test_private_training_refuses_an_encoder_of_another_pool(tmp_path: Path, digits_encoder: Path):
    config = PrivateTrainingConfig(**{**TINY, "student_arch": "cnn"}, epsilon=10.0, sigma=1.0,
                                   student_init=str(digits_encoder), public_size=100)
    with pytest.raises(ConfigError, match="was pretrained on 'the first 200 test images of digits"):
        train_private(config, tmp_path)
    assert not (tmp_path / "student.safetensors").exists()


def _npz(path: Path, train: int, **extra) -> Path:
    """`train` random 8x8 training images (and 40 test ones) in four classes, as an .npz."""
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (train, 8, 8), dtype=np.uint8), y_train=np.arange(train) % 4,
             x_test=rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), y_test=np.arange(40) % 4, **extra)
    return path


@pytest.mark.slow
def test_dpsgd_plans_its_sampling_from_the_declared_size_never_the_exact_count(tmp_path: Path):
    config = lambda data: PrivateTrainingConfig(dataset=str(data), epsilon=2.0, batch_size=64, epochs=2,  # noqa: E731
                                                student_arch="scatter-linear", lr=1.0)
    released = []
    for train in (512, 513):  # one example more: the released plan must not move
        report = train_private(config(_npz(tmp_path / f"data{train}.npz", train, declared_size=600)),
                               tmp_path / f"run{train}")
        privacy = report["privacy"]
        assert privacy["declared_size"] == 600 and "training-set size 600" in privacy["sampling"]
        assert "a public figure the data declare" in privacy["training_set_size"]
        released.append((privacy["sample_rate"], privacy["steps"], privacy["noise_multiplier"], privacy["epsilon"]))
    assert released[0] == released[1]
    given = dataclasses.replace(config(_npz(tmp_path / "undeclared.npz", 512)), dataset_size=700)
    assert train_private(given, tmp_path / "given")["privacy"]["declared_size"] == 700


@pytest.mark.slow
def test_without_a_declared_size_dpsgd_plans_on_a_noisy_count_inside_its_budget(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))
    data = _npz(tmp_path / "undeclared.npz", 512)
    config = PrivateTrainingConfig(dataset=str(data), epsilon=2.0, batch_size=64, epochs=2,
                                   student_arch="scatter-linear", lr=1.0)
    report = train_private(config, tmp_path / "run")
    privacy, count = report["privacy"], NoisyCount.within(0.01 * 2.0)  # scale 50: rounded to tens
    size = json.loads((tmp_path / "run" / "config.json").read_text())["counted_size"]
    assert size == privacy["declared_size"] == report["config"]["counted_size"] and size % 10 == 0
    assert 0 < abs(size - 512) < 400 or size == 510  # |noise| above 400 has probability e^-8
    assert privacy["size_count_epsilon"] == count.epsilon == 0.02 and "a noisy count" in privacy["training_set_size"]
    steps = composed_epsilon(SampledGaussianQuery(privacy["noise_multiplier"], privacy["sample_rate"]),
                             privacy["steps"], 1e-5)
    assert privacy["epsilon"] == pytest.approx(count.epsilon + steps) and 1.99 < privacy["epsilon"] <= 2.0
    entry, = json.loads((tmp_path / "ledgers" / "ledger.json").read_text())["entries"]
    assert entry["event"]["events"][0] == event_to_json(count.dp_event()) and entry["status"] == "spent"
    assert entry["epsilon"] == pytest.approx(privacy["epsilon_replace_one"])  # the count's included
    # a resumed run keeps its count: the configuration saved holds it
    assert PrivateTrainingConfig.from_dict(report["config"]).counted_size == size


def test_a_run_that_fails_before_its_first_step_is_charged_its_noisy_count_alone(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))

    def fail(self):
        raise RuntimeError("the loader broke")
        yield

    monkeypatch.setattr(PoissonBatchSampler, "__iter__", fail)
    config = PrivateTrainingConfig(dataset=str(_npz(tmp_path / "data.npz", 512)), epsilon=2.0, batch_size=64,
                                   epochs=1, student_arch="scatter-linear", lr=1.0)
    with pytest.raises(RuntimeError, match="the loader broke"):
        train_private(config, tmp_path / "run")
    entry, = json.loads((tmp_path / "ledgers" / "ledger.json").read_text())["entries"]
    assert entry["status"] == "spent" and entry["epsilon"] == 0.02
    assert entry["event"] == event_to_json(NoisyCount.within(0.02).dp_event())
    declared = _npz(tmp_path / "declared.npz", 513, declared_size=512)  # nothing released: nothing kept
    with pytest.raises(RuntimeError, match="the loader broke"):
        train_private(dataclasses.replace(config, dataset=str(declared)), tmp_path / "declared-run")
    assert len(json.loads((tmp_path / "ledgers" / "ledger.json").read_text())["entries"]) == 1


def test_an_epoch_reports_how_far_into_it_the_run_is(tmp_path: Path, monkeypatch):
    """A DP-SGD epoch of a large student takes minutes: its steps say where the run is (PACE_SECONDS 0 here: every
    step), then the epoch's end with its accuracy."""
    from dpdistill import progress

    monkeypatch.setattr(progress, "PACE_SECONDS", 0.0)
    records: list[dict] = []
    train_private(PrivateTrainingConfig(**TINY, epsilon=10.0, sigma=1.0, epochs=1), tmp_path, progress=records.append)
    epochs = [record["epoch"] for record in records if "phase" not in record]
    assert epochs[0] == 0 and epochs[-1] == 1 and len(epochs) > 3 and epochs == sorted(epochs)
    assert "test_accuracy" in records[-1]


@pytest.mark.parametrize("ema_decay", [0.0, 0.9])
def test_a_run_stopped_within_an_epoch_resumes_at_its_last_step_saved(tmp_path: Path, monkeypatch, ema_decay):
    """Saved on time within an epoch (after every step here: CHECKPOINT_SECONDS 0), stopped before step 13 of 23: the
    resumed run goes on from step 13, runs exactly the planned steps and, with (debugging) reproducible noise whose
    stream the checkpoint keeps, ends where an uninterrupted run ends; releasing the average of its iterates, the
    same average (the checkpoint keeps it)."""
    from dpdistill import progress
    from dpdistill.training import state

    monkeypatch.setattr(progress, "PACE_SECONDS", 0.0)
    monkeypatch.setattr(state, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(state, "SAVE_SHARE", float("inf"))
    config = PrivateTrainingConfig(**TINY, epsilon=10.0, sigma=1.0, epochs=2, reproducible_noise=True,
                                   ema_decay=ema_decay)
    whole = train_private(config, tmp_path / "whole")

    def stop_before_step_13(record: dict) -> None:
        if record.get("epoch") == round(12 / 23, 2):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_private(config, tmp_path / "cut", progress=stop_before_step_13)
    records: list[dict] = []
    resumed = train_private(None, tmp_path / "cut", resume=True, progress=records.append)
    assert [record["epoch"] for record in records if "phase" not in record][0] == round(12 / 23, 2)
    assert resumed["privacy"]["steps"] == whole["privacy"]["steps"] == 46
    assert resumed["history"] == whole["history"]
    weights, again = load_file(tmp_path / "whole" / "student.safetensors"), load_file(tmp_path / "cut" / "student.safetensors")
    assert all(torch.equal(weights[name], again[name]) for name in weights)


def test_a_run_with_a_moving_average_releases_and_measures_the_average_of_its_iterates(tmp_path: Path, monkeypatch):
    """The saved student is sum_i d^(t-i) w_i / sum_i d^(t-i) over the weights after each of the 23 steps, the
    accuracy reported is that student's, and each epoch also gives the last iterate's."""

    iterates: list[dict[str, torch.Tensor]] = []
    step = DPSGDTrainer._step

    def recorded(self, inputs, labels):
        losses = step(self, inputs, labels)
        iterates.append({name: weight.detach().clone() for name, weight in self.trained.named_parameters()})
        return losses

    monkeypatch.setattr(DPSGDTrainer, "_step", recorded)
    decay = 0.8
    report = train_private(PrivateTrainingConfig(**TINY, epsilon=10.0, sigma=1.0, epochs=1, ema_decay=decay), tmp_path)
    assert len(iterates) == 23
    ages = [decay ** (len(iterates) - 1 - index) for index in range(len(iterates))]
    saved = load_file(tmp_path / "student.safetensors")
    for name in iterates[0]:
        expected = sum(age * iterate[name] for age, iterate in zip(ages, iterates)) / sum(ages)
        assert torch.allclose(saved[name], expected, atol=1e-6)
        assert not torch.allclose(saved[name], iterates[-1][name])
    [epoch] = report["history"]
    assert report["accuracy"]["student"] == epoch["test_accuracy"] and 0 <= epoch["last_iterate_accuracy"] <= 1
    assert evaluate(tmp_path, "digits", "student")["accuracy"] == pytest.approx(report["accuracy"]["student"])


def test_a_batch_in_per_example_chunks_takes_the_whole_batchs_step(tmp_path: Path, monkeypatch):
    """Chunks of a Poisson batch clipped into one sum are one noisy step of the batch: the same weights (the cnn
    has no dropout, whose masks would be drawn chunk by chunk) and the same accounting."""
    config = PrivateTrainingConfig(**{**TINY, "student_arch": "cnn"}, epsilon=10.0, sigma=1.0, epochs=1,
                                   reproducible_noise=True)
    whole = train_private(config, tmp_path / "whole")
    monkeypatch.setattr(private, "PER_EXAMPLE_CHUNK", 16)  # about 4 chunks a batch of 64
    passes: list[int] = []
    backward = DPSGDTrainer._per_example_gradients
    monkeypatch.setattr(DPSGDTrainer, "_per_example_gradients",
                        lambda self, inputs, labels: passes.append(len(labels)) or backward(self, inputs, labels))
    chunked = train_private(config, tmp_path / "chunked")
    assert max(passes) == 16 and len(passes) > 3 * 23  # the blank check's pass, then chunks
    assert chunked["privacy"]["steps"] == whole["privacy"]["steps"] == 23
    assert chunked["privacy"]["epsilon"] == whole["privacy"]["epsilon"]
    weights, again = (load_file(tmp_path / run / "student.safetensors") for run in ("whole", "chunked"))
    assert all(torch.allclose(weights[name], again[name], atol=1e-5) for name in weights)
