"""PATE on public images: the split never evaluates on public images, the budget is charged once and never twice,
the answers follow the votes, and the student learns from them."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch
from safetensors.torch import load_file, save_file

from dpdistill.data import load_dataset
from dpdistill.errors import BudgetExceededError, CheckpointError, ConfigError, DatasetError, PrivacyParameterError
from dpdistill.methods import pate as pate_module
from dpdistill.data.public import public_split
from dpdistill.methods.pate import (ANSWERS_FILE, ANSWERS_PHASE, Answers, PateConfig, PateJob, choose_queries,
                                    kmeans_representatives, plurality_posterior, release_answers, vote_counts)
from dpdistill.models.ensemble import TeacherEnsemble, load_teacher
from dpdistill.pipeline import interrupted_pate, pate
from dpdistill.privacy.budget import plan_privacy
from dpdistill.privacy.randomness import ReproducibleNoise
from dpdistill.training.semi_supervised import VIEWS_PHASE
from dpdistill.training.vae import VAE_PHASE
from helpers import assert_confusion_matches_accuracy

# Almost noiseless votes: a budget no one would release with, to test the mechanics and that learning happens.
LOUD = {"epsilon": 1e6, "sigma": 0.05}


def test_the_pool_and_the_evaluation_images_are_disjoint_parts_of_the_test_split():
    digits = load_dataset("digits")
    split = public_split(digits, None, 200)
    assert torch.equal(split.pool, digits.x_test[:200])
    assert torch.equal(split.x_eval, digits.x_test[200:]) and torch.equal(split.y_eval, digits.y_test[200:])
    assert torch.equal(split.pool_labels, digits.y_test[:200])  # only to report answer quality
    with pytest.raises(ConfigError, match="leaves none to measure accuracy"):
        public_split(digits, None, len(digits.y_test))


def test_the_default_pool_is_at_most_half_the_test_split_it_comes_from():
    digits = load_dataset("digits")  # 360 test images: a pool of 180, not the 5,000 that would leave none
    split = PateConfig(epsilon=1, queries=100).public_split(digits)
    assert len(split.pool) == 180 and len(split.y_eval) == 180
    with pytest.raises(ConfigError, match="the public pool holds 180: lower --queries"):
        PateConfig(epsilon=1, queries=200).public_split(digits)


def test_another_public_data_set_gives_its_training_images_and_must_match_the_shape(tmp_path: Path):
    digits = load_dataset("digits")
    rng = np.random.default_rng(0)
    same = tmp_path / "public.npz"
    np.savez(same, x_train=rng.integers(0, 256, (300, 8, 8), dtype=np.uint8), y_train=np.arange(300) % 2,
             x_test=rng.integers(0, 256, (10, 8, 8), dtype=np.uint8), y_test=np.arange(10) % 2)
    split = public_split(digits, str(same), 250)
    assert split.pool.shape == (250, 1, 8, 8) and torch.equal(split.y_eval, digits.y_test)
    assert split.pool_labels is None
    with pytest.raises(ConfigError, match="fewer than --public-size"):
        public_split(digits, str(same), 301)
    other = tmp_path / "wide.npz"
    np.savez(other, x_train=np.zeros((300, 10, 10), dtype=np.uint8), y_train=np.arange(300) % 2,
             x_test=np.zeros((10, 10, 10), dtype=np.uint8), y_test=np.arange(10) % 2)
    with pytest.raises(DatasetError, match="teachers expect"):
        public_split(digits, str(other), 250)


@pytest.mark.parametrize("values, error, message", [
    ({"epsilon": None}, PrivacyParameterError, "budget"),
    ({"epsilon": 1, "vote_margin": -1}, ConfigError, "vote-margin"),
    ({"epsilon": 1, "pseudo_label_confidence": 0}, ConfigError, "pseudo-label-confidence"),
    ({"epsilon": 1, "query_selection": "best"}, ConfigError, "unknown query selection 'best'"),
    ({"epsilon": 1, "student_training": "mixup"}, ConfigError, "unknown student training 'mixup'"),
    ({"epsilon": 1, "answer_targets": "mean"}, ConfigError, "unknown answer targets 'mean'"),
    ({"epsilon": 1, "answer_targets": "shares"}, ConfigError, "exact votes"),
    ({"vote_noise": "none", "epsilon": 1}, ConfigError, "drop --epsilon"),
    ({"epsilon": 1, "student_training": "consistency", "consistency_threshold": 0}, ConfigError, "threshold"),
])
def test_impossible_settings_are_refused(values, error, message):
    with pytest.raises(error, match=message):
        PateConfig(**values)


def test_more_queries_than_public_images_are_refused_before_the_teachers_are_read(tmp_path: Path):
    with pytest.raises(ConfigError, match="at least as many public images"):
        PateJob(tmp_path / "no-teachers", PateConfig(epsilon=1, queries=300, public_size=200), tmp_path, None)


def test_kmeans_picks_one_typical_point_per_cluster():
    generator = torch.Generator().manual_seed(0)
    blobs = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    points = (blobs.repeat_interleave(30, 0) + 0.5 * torch.randn(90, 2, generator=generator))
    points[0] = points[1:30].mean(0)  # the first blob's centre: its typical point, the one to be chosen there
    chosen = kmeans_representatives(points, 3, torch.Generator().manual_seed(1))
    assert sorted((chosen // 30).tolist()) == [0, 1, 2] and 0 in chosen.tolist()
    assert sorted(kmeans_representatives(points, 90, generator).tolist()) == list(range(90))  # every point once


def test_both_query_selections_give_distinct_pool_images():
    pool = load_dataset("digits").x_test[:200]
    for selection in ("random", "kmeans"):
        indices = choose_queries(pool, PateConfig(epsilon=1, queries=120, public_size=200,
                                                  query_selection=selection))
        assert len(indices.unique()) == 120 and 0 <= indices.min() and indices.max() < 200


def test_answers_are_charged_once_and_follow_the_noisy_plurality(digits_ensemble: Path):
    ensemble, _ = load_teacher(digits_ensemble)
    digits = load_dataset("digits")
    config = PateConfig(queries=120, public_size=200, **LOUD)
    plan = plan_privacy(config.privacy_request(len(ensemble), 10), 10, config.queries, 1)
    answers = release_answers(ensemble, digits.x_test[:200], plan, config, 10)
    assert len(answers.indices.unique()) == 120  # distinct public images
    votes = vote_counts(ensemble, digits.x_test[:200][answers.indices], 10, torch.device("cpu"))
    assert votes.sum(1).eq(len(ensemble)).all()
    leaders = votes.max(1)
    clear = (votes >= leaders.values[:, None] - 0.5).sum(1) == 1  # no tie: noise of std 0.05 cannot flip it
    assert torch.equal(answers.labels[clear], leaders.indices[clear])
    assert torch.equal(answers.labels, answers.votes.argmax(1))  # the label is the released histogram's winner
    assert (answers.votes - votes).abs().max() < 0.05 * 6  # the histogram is the votes plus noise of std 0.05


def test_the_posterior_of_the_winner_is_exact_for_two_classes_and_matches_sampling_for_more():
    # two classes: the true counts differ by N(gap, 2 sigma^2), so the leader wins with probability
    # Phi(gap / (sigma sqrt 2))
    gaps = torch.tensor([0.0, 0.5, 1.0, 3.0])
    posterior = plurality_posterior(torch.stack([gaps, torch.zeros(4)], 1), sigma=2.0)
    expected = torch.distributions.Normal(0.0, 1.0).cdf(gaps / (2.0 * 2 ** 0.5))
    assert torch.allclose(posterior[:, 0], expected, atol=1e-5)
    assert torch.allclose(posterior.sum(1), torch.ones(4))
    noisy = torch.tensor([[30.0, 25.0, 0.0, -5.0], [10.0, 10.0, 10.0, 10.0], [500.0, 0.0, 0.0, 0.0]])
    draws = noisy + 10.0 * torch.randn((200_000, *noisy.shape), generator=torch.Generator().manual_seed(0))
    sampled = torch.nn.functional.one_hot(draws.argmax(2), 4).float().mean(0)
    exact = plurality_posterior(noisy, sigma=10.0)
    assert torch.allclose(exact, sampled, atol=0.005)  # 200,000 draws: standard error at most 0.0011
    assert torch.allclose(exact[1], torch.full((4,), 0.25), atol=1e-5) and exact[2, 0] == 1.0


def test_vote_accounting_matches_the_privacy_note_and_calibrates_to_the_budget(digits_ensemble: Path):
    # privacy note, PATE aggregators: GNMax with sigma 40 on 1000 answered queries spends 4.98 (PLD)
    fixed = PateConfig(epsilon=5, sigma=40, queries=1000, public_size=1000)
    plan = plan_privacy(fixed.privacy_request(250, 10), 10, 1000, 1)
    assert plan.summary(1000)["epsilon"] == pytest.approx(4.98, abs=0.01)
    calibrated = PateConfig(epsilon=1, queries=100, public_size=200)
    plan = plan_privacy(calibrated.privacy_request(4, 10), 10, 100, 1)
    assert plan.summary(100)["epsilon"] == pytest.approx(1, rel=1e-3)


def test_a_fixed_sigma_that_overspends_is_refused_before_anything_is_written(digits_ensemble: Path, tmp_path: Path):
    config = PateConfig(epsilon=1, sigma=1.0, queries=100, public_size=200)
    with pytest.raises(BudgetExceededError):
        pate(digits_ensemble, config, tmp_path / "run")
    assert not (tmp_path / "run" / "private" / "resume").exists() and not (tmp_path / "run" / "student.safetensors").exists()


def test_an_encoder_pretrained_on_another_pool_is_refused_before_any_answer(digits_ensemble: Path,
                                                                             digits_encoder: Path, tmp_path: Path):
    config = PateConfig(queries=100, public_size=250, student_arch="cnn", student_init=str(digits_encoder), **LOUD)
    with pytest.raises(ConfigError, match="pretrained on 'the first 200 test images of digits"):
        pate(digits_ensemble, config, tmp_path / "run")  # 50 of its measured images would be in the encoder's pool
    assert not (tmp_path / "run" / "private" / "resume").exists()


def test_the_student_learns_from_the_answers(digits_ensemble: Path, tmp_path: Path):
    config = PateConfig(queries=200, public_size=250, min_steps=300, self_training_rounds=1, **LOUD)
    records: list[dict] = []
    report = pate(digits_ensemble, config, tmp_path, progress=records.append)
    answering = [record["done"] for record in records if record.get("phase") == ANSWERS_PHASE]
    assert answering[-1] == 200 and [record["done"] for record in records if "phase" not in record] == [1, 2]
    assert {"student round 1", "student round 2"} <= {record.get("phase") for record in records}  # their epochs
    assert config.progress_total() == 2
    assert report["accuracy"]["answers"] > 0.8
    assert report["accuracy"]["student"] > 0.5  # chance is 0.1
    assert_confusion_matches_accuracy(report, tmp_path, 10)
    assert report["privacy"]["queries"] == 200 and report["privacy"]["teachers"] == 4
    assert [record["round"] for record in report["history"]] == [1, 2]
    assert (tmp_path / ANSWERS_FILE).exists() and not (tmp_path / "private" / "resume").exists()
    assert "PATE on public images" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_a_consistency_student_learns_from_the_answers_and_the_unlabelled_pool(digits_ensemble: Path, tmp_path: Path):
    config = PateConfig(queries=100, public_size=250, batch_size=32, self_training_rounds=0, student_arch="cnn",
                        student_training="consistency", consistency_steps=150, **LOUD)
    records: list[dict] = []
    report = pate(digits_ensemble, config, tmp_path, progress=records.append)
    steps = [record["done"] for record in records if "phase" not in record]
    assert steps == [*range(1, 151), 150] and config.progress_total() == 150  # each step, then the round's end
    assert report["accuracy"]["student"] > 0.5  # from 100 answers; chance is 0.1; 0.68-0.75 on four ensembles
    assert [record["round"] for record in report["history"]] == [1]
    assert "consistency training (FixMatch)" in (tmp_path / "report.md").read_text()


def test_a_student_learns_from_soft_posterior_targets(digits_ensemble: Path, tmp_path: Path):
    config = PateConfig(queries=150, public_size=250, min_steps=300, self_training_rounds=1,
                        answer_targets="posterior", epsilon=1000, sigma=0.7)  # a few close calls
    report = pate(digits_ensemble, config, tmp_path)
    assert report["accuracy"]["student"] > 0.5  # chance is 0.1
    assert report["privacy"]["answer_targets"] == "posterior"
    answers = Answers.load(tmp_path / ANSWERS_FILE, 150)
    targets = pate_module.answer_targets(answers, config, report["privacy"]["sigma"])
    assert targets.shape == (150, 10) and torch.equal(targets.argmax(1), answers.labels)
    assert ((targets.max(1).values > 0.99).any() and (targets.max(1).values < 0.9).any())  # sure and unsure ones


def test_an_interrupted_run_resumes_from_its_answers_without_asking_again(digits_ensemble: Path, tmp_path: Path,
                                                                           monkeypatch):
    config = PateConfig(queries=100, public_size=200, min_steps=50, self_training_rounds=0, **LOUD)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pate_module, "train_student", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pate(digits_ensemble, config, tmp_path)
    released = Answers.load(tmp_path / "private" / "resume" / ANSWERS_FILE, 100)
    assert interrupted_pate(tmp_path) == (digits_ensemble, config)  # what a resume runs (and its progress shows)
    with pytest.raises(ConfigError, match="unfinished run"):
        pate(digits_ensemble, config, tmp_path)
    monkeypatch.undo()

    def asked_again(self, images):
        raise AssertionError("the ensemble was asked again: the budget would be spent twice")

    monkeypatch.setattr(TeacherEnsemble, "member_logits", asked_again)
    report = pate(digits_ensemble, None, tmp_path, resume=True)
    assert interrupted_pate(tmp_path) is None
    kept = Answers.load(tmp_path / ANSWERS_FILE, 100)
    assert torch.equal(kept.labels, released.labels) and torch.equal(kept.indices, released.indices)
    assert report["resumed"] and report["privacy"]["queries"] == 100
    assert json.loads((tmp_path / "config.json").read_text())["pate"]["queries"] == 100


def test_damaged_answers_are_a_clear_error(tmp_path: Path):
    (tmp_path / ANSWERS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="damaged") as caught:
        Answers.load(tmp_path / ANSWERS_FILE, 10)
    assert "spending the budget twice" in str(caught.value)


def test_answers_without_the_noisy_histogram_are_named_as_older(tmp_path: Path):
    save_file({"indices": torch.arange(10), "labels": torch.zeros(10, dtype=torch.int64),
               "confident": torch.ones(10, dtype=torch.bool)}, tmp_path / ANSWERS_FILE)
    with pytest.raises(CheckpointError, match="older dpdistill") as caught:
        Answers.load(tmp_path / ANSWERS_FILE, 10)
    assert "damaged" not in str(caught.value) and "budget twice" in str(caught.value)


def _true_counts(ensemble_dir: Path, answers: Answers) -> torch.Tensor:
    """What the attacker wants: the members' exact vote counts on the asked public images."""
    ensemble, _ = load_teacher(ensemble_dir)
    pool = public_split(load_dataset("digits"), None, 200).pool
    return vote_counts(ensemble, pool[answers.indices], 10, torch.device("cpu")).float()


def _release(ensemble_dir: Path, out: Path, **settings) -> tuple[dict, Answers]:
    config = PateConfig(epsilon=1, queries=100, public_size=200, min_steps=20, epochs=1, self_training_rounds=0,
                        **settings)
    pate(ensemble_dir, config, out)
    return json.loads((out / "report.json").read_text()), Answers.load(out / ANSWERS_FILE, 100)


def test_the_released_seed_does_not_remove_the_noise(digits_ensemble: Path, tmp_path: Path):
    """The attack on the old release: regenerate the noise from the report's seed and subtract it."""
    runs = [_release(digits_ensemble, tmp_path / name) for name in ("first", "second")]
    counts = _true_counts(digits_ensemble, runs[0][1])
    for report, answers in runs:
        privacy = report["privacy"]
        assert privacy["noise"].startswith("secure") and privacy["covered"].startswith("the student")
        old_noise = torch.randn(answers.votes.shape, generator=torch.Generator().manual_seed(report["seed"] + 1))
        for guess in (old_noise * privacy["sigma"], ReproducibleNoise(report["seed"]).discrete_gaussian(
                answers.votes.shape, privacy["sigma"])):
            recovered = (answers.votes - guess).round()
            assert not (recovered == counts).all(1).any()  # not one answer's counts come back
    first, second = (answers for _, answers in runs)
    assert torch.equal(first.indices, second.indices)  # the seed chooses which images are asked...
    assert not torch.equal(first.votes, second.votes)  # ...never the noise: identical runs release different answers


def test_with_reproducible_noise_the_attack_succeeds_and_the_report_says_so(digits_ensemble: Path, tmp_path: Path):
    """The audit has power: a release whose noise follows from its seed gives back every exact vote count."""
    report, answers = _release(digits_ensemble, tmp_path, reproducible_noise=True)
    privacy = report["privacy"]
    assert privacy["covered"] == "NO guarantee: the noise is reproducible" and privacy["formal_guarantee"] is False
    assert "NO guarantee" in privacy["noise"]
    noise = ReproducibleNoise(report["seed"]).discrete_gaussian(answers.votes.shape, privacy["sigma"])
    assert torch.equal(answers.votes - noise, _true_counts(digits_ensemble, answers))


def test_the_released_vote_noise_is_integer_and_a_discrete_gaussian_of_the_planned_sigma(digits_ensemble: Path):
    ensemble, _ = load_teacher(digits_ensemble)
    config = PateConfig(epsilon=1, queries=200, public_size=200)
    plan = plan_privacy(config.privacy_request(len(ensemble), 10), 10, config.queries, 1)
    answers = release_answers(ensemble, load_dataset("digits").x_test[:200], plan, config, 10)
    noise = answers.votes - _true_counts(digits_ensemble, answers)
    assert torch.equal(noise, noise.round()) and plan.query.discrete
    values = noise.flatten().double().numpy()
    assert scipy.stats.ttest_1samp(values, 0.0).pvalue > 1e-6
    assert _variance_p_value(values, plan.sigma) > 1e-6
    assert _variance_p_value(values, plan.sigma * 1.2) < 1e-6  # the test has power: 20% more noise is told apart


def _variance_p_value(values: np.ndarray, sigma: float) -> float:
    """Two-sided test of variance sigma^2 for zero-mean noise: sum(x^2) / sigma^2 ~ chi2(n) (at sigma >= 1 the
    discrete Gaussian's variance is sigma^2 to a relative 4 pi^2 sigma^2 e^(-4 pi^2 sigma^2); Canonne et al.)."""
    statistic = np.sum(values**2) / sigma**2
    return 2 * min(scipy.stats.chi2.cdf(statistic, len(values)), scipy.stats.chi2.sf(statistic, len(values)))


def test_a_vote_margin_keeps_only_clear_leads_and_charges_every_answer(digits_ensemble: Path):
    """Four members; noise of std 0.05 cannot move a count by half a vote, so a margin of 30 sigmas (1.5 votes)
    keeps exactly the answers whose true leader is ahead by two votes or more. 350 queries: members trained on
    random partitions disagree on some of them, so both kinds occur."""
    ensemble, _ = load_teacher(digits_ensemble)
    pool = load_dataset("digits").x_test[:350]
    config = PateConfig(queries=350, public_size=350, vote_margin=30.0, **LOUD)
    plan = plan_privacy(config.privacy_request(len(ensemble), 10), 10, config.queries, 1)
    answers = release_answers(ensemble, pool, plan, config, 10)
    votes = vote_counts(ensemble, pool[answers.indices], 10, torch.device("cpu")).topk(2, dim=1).values
    clear = votes[:, 0] - votes[:, 1] >= 2
    assert torch.equal(answers.confident, clear) and 0 < clear.sum() < 350
    assert len(answers.labels) == 350  # every asked image was answered, and charged, kept or not


def test_a_vote_margin_that_keeps_no_answer_is_an_error_after_the_answers_were_charged(digits_ensemble: Path,
                                                                                         tmp_path: Path):
    config = PateConfig(queries=40, public_size=200, vote_margin=1000.0, min_steps=5, **LOUD)  # 50 votes: > 4
    with pytest.raises(ConfigError, match="kept no answer"):
        pate(digits_ensemble, config, tmp_path)
    entries = json.loads((digits_ensemble / "ledger.json").read_text())["entries"]
    (entry,) = [entry for entry in entries if entry["out_dir"] == str(tmp_path.resolve())]
    assert entry["status"] == "reserved" and entry["event"]["count"] == 40  # the release happened: it counts


@pytest.mark.slow
def test_a_tangent_normal_student_learns_from_the_answers_and_the_vae_triples(digits_ensemble: Path, tmp_path: Path):
    config = PateConfig(queries=100, public_size=250, batch_size=32, self_training_rounds=0, student_arch="cnn",
                        student_training="tangent-normal", consistency_steps=300, vae_steps=150, **LOUD)
    records: list[dict] = []
    report = pate(digits_ensemble, config, tmp_path, progress=records.append)
    assert report["accuracy"]["student"] > 0.5  # from 100 answers; chance is 0.1; 0.76-0.81 on three ensembles
    fit = [record for record in records if record.get("phase") == VAE_PHASE]  # the VAE's fit shows, each step
    assert [record["done"] for record in fit] == list(range(1, 151)) and fit[-1]["total"] == 150
    steps = [record for record in records if "phase" not in record]  # then the student's, each step, and its end
    assert [record["done"] for record in steps] == [*range(1, 301), 300]
    views = [record for record in records if record.get("phase") == VIEWS_PHASE]  # and the triples made between
    assert views[-1]["done"] == views[-1]["total"] > 0
    assert "tangent-normal training (DGD" in (tmp_path / "report.md").read_text()


def test_lnmax_answers_carry_discrete_laplace_noise_and_refuse_posterior_targets(digits_ensemble: Path,
                                                                                 tmp_path: Path):
    config = PateConfig(queries=100, public_size=250, self_training_rounds=0, vote_noise="laplace", epsilon=1e6,
                        sigma=1, min_steps=100)
    report = pate(digits_ensemble, config, tmp_path)
    assert report["accuracy"]["answers"] > 0.6  # four members' votes, noise of scale 1: measured 0.79 to 0.85
    assert "discrete Laplace noise (LNMax)" in report["privacy"]["aggregation"]
    noise = load_file(tmp_path / ANSWERS_FILE)["votes"]
    assert torch.equal(noise, noise.round())  # integer counts plus integer noise
    with pytest.raises(ConfigError, match="posterior targets model Gaussian"):
        PateConfig(epsilon=1, vote_noise="laplace", answer_targets="posterior")


@pytest.mark.parametrize("settings", [{"student_schedule": "linear"}, {"feature_distance": "raw"},
                                      {"student_training": "consistency", "feature_distance": "raw"}])
def test_a_student_setting_its_training_would_ignore_is_refused(settings: dict):
    with pytest.raises(ConfigError, match="apply to|applies to"):
        PateConfig(epsilon=1.0, **settings)
