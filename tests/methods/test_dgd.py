"""DGD: the faithful pipeline says it has no formal guarantee and shows the seed's figure only as a paper formula,
resumes on the same images without asking again; the covered variant composes with its source; bad settings are
refused before any work."""

import dataclasses
import json
import math
import shutil
from pathlib import Path

import dp_accounting
import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill.errors import BudgetExceededError, ConfigError, PrivacyParameterError
from dpdistill.methods import pate as pate_module
from dpdistill.methods.dgd import (FIXED_SELECTION, GENERATOR_STATE, DgdConfig, build_dgd_config, paper_epsilon,
                                   parse_dgd_assignments)
from dpdistill.methods.pate import ANSWERS_FILE, Answers
from dpdistill.models.ensemble import TeacherEnsemble
from dpdistill.models.registry import build_classifier
from dpdistill.pipeline import dgd
from dpdistill.privacy.accounting import DiscreteLaplaceQuery
from dpdistill.privacy.ledger import ReleaseLedger
from dpdistill.privacy.selection import FASHION_MNIST, SELECTION, selection_notes
from dpdistill.progress import MILESTONE_KEYS
from dpdistill.training.data_free import (GENERATOR_PHASE, IMAGES_PHASE, DataFreeConfig, generate,
                                         train_data_free_generator)
from helpers import write_sample_source

TINY = {"synthetic_size": 300, "generator_steps": 10, "generator_batch_size": 32, "generator_width": (16, 8, 8),
        "vae_steps": 30, "consistency_steps": 30, "batch_size": 16}


def test_the_paper_settings_follow_the_budget_and_the_variant():
    faithful = build_dgd_config(1.0, baseline="b", preset="paper")
    assert (faithful.labelling.queries, faithful.labelling.vote_noise, faithful.labelling.sigma) == (27, "laplace", 40)
    assert faithful.labelling.student_training == "tangent-normal" and faithful.generator == DataFreeConfig()
    assert build_dgd_config(10.0, baseline="b").labelling.queries == 1300
    covered = build_dgd_config(10.0, sample_source="s")
    assert (covered.labelling.vote_noise, covered.labelling.sigma) == ("gaussian", None)  # GNMax, calibrated
    gaussian = build_dgd_config(1.0, baseline="b", settings={"vote_noise": "gaussian"})
    assert gaussian.labelling.sigma is None  # the Laplace scale is no Gaussian sigma
    assert parse_dgd_assignments(["generator_steps=5", "queries=9", "synthetic_size=7"]) == {
        "generator_steps": 5, "queries": 9, "synthetic_size": 7}
    config = build_dgd_config(1.0, baseline="b", settings=parse_dgd_assignments(["generator_width=8,8,4"]))
    assert DgdConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config  # what a resume reads back


def test_the_fixed_preset_holds_the_departures_its_control_measured_and_set_overrides_them():
    fixed = build_dgd_config(10.0, baseline="b", preset="fixed")
    assert fixed.generator.batchnorm_weight == 1.0 and fixed.generator.final_batchnorm
    assert (fixed.labelling.student_arch, fixed.labelling.student_training, fixed.labelling.augment_shift) == (
        "scatter-linear", "supervised", 0)
    assert (fixed.labelling.queries, fixed.labelling.vote_noise) == (1300, "laplace")  # the seed's answers kept
    assert build_dgd_config(10.0, baseline="b", preset="fixed") == build_dgd_config(10.0, baseline="b")  # the default
    overridden = build_dgd_config(10.0, baseline="b", preset="fixed", settings={"student_arch": "cnn"})
    assert overridden.labelling.student_arch == "cnn" and overridden.generator.batchnorm_weight == 1.0


@pytest.mark.parametrize("call, error, message", [
    (lambda: build_dgd_config(None, baseline="b"), PrivacyParameterError, "budget"),
    (lambda: build_dgd_config(3.0, baseline="b"), ConfigError, "queries=N"),
    (lambda: build_dgd_config(1.0, baseline="b", sample_source="s"), ConfigError, "drop --sample-source"),
    (lambda: build_dgd_config(1.0, sample_source="s", settings={"synthetic_size": 10}), ConfigError, "--baseline"),
    (lambda: build_dgd_config(1.0, baseline="b", settings={"generator_decay": 1}), ConfigError, "unknown DGD"),
    (lambda: build_dgd_config(1.0, baseline="b", settings={"generator_activation_norm": 3}), ConfigError, "1 or 2"),
    (lambda: parse_dgd_assignments(["colour=red"]), ConfigError, "cannot set"),
    (lambda: DataFreeConfig(batchnorm_weight=-1.0), ConfigError, "must not be negative"),
    (lambda: train_data_free_generator(build_classifier("datalens", (1, 8, 8), 10), (1, 8, 8),
                                       DataFreeConfig(batchnorm_weight=1.0), 0, "cpu"), ConfigError, "BatchNorm"),
    (lambda: build_dgd_config(1.0, baseline="b", settings={"vote_noise": "none"}), ConfigError, "drop --epsilon"),
    (lambda: build_dgd_config(None, baseline="b", settings={"vote_noise": "none"}), ConfigError, "every synthetic"),
    (lambda: build_dgd_config(None, baseline="b", settings={"vote_noise": "none", "queries": 5,
                                                            "answer_targets": "posterior"}), ConfigError, "argmax"),
    (lambda: build_dgd_config(1.0, baseline="b", settings={"answer_targets": "shares"}), ConfigError, "exact votes"),
    (lambda: build_dgd_config(1.0, baseline="b", preset="faithful"), ConfigError, "choose paper, fixed"),
])
def test_impossible_settings_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_data_free_generator_learns_what_the_baseline_calls_confident_and_balanced(digits_teacher: Path):
    from dpdistill.losses.generator import data_free_terms
    from dpdistill.models.ensemble import load_teacher

    baseline, _ = load_teacher(digits_teacher)
    config = DataFreeConfig(steps=60, batch_size=64, width=(16, 8, 8))
    untrained, _ = train_data_free_generator(baseline, (1, 8, 8), DataFreeConfig(steps=1, width=(16, 8, 8)), 0, "cpu")
    records: list[dict] = []
    generator, report = train_data_free_generator(baseline, (1, 8, 8), config, 0, "cpu", records.append)
    # a named phase that moves every step (a 2,000-step run once showed "student steps" for minutes at a time)
    assert [(record["phase"], record["done"], record["total"]) for record in records] == [
        (GENERATOR_PHASE, step, 60) for step in range(1, 61)]
    assert [record["done"] for record in records if set(record) & set(MILESTONE_KEYS)] == [60]  # a log keeps the loss
    made: list[dict] = []  # making the images is a phase too (DGD's 60,000 sat minutes without a line)
    assert len(generate(generator, 2500, 1, "cpu", made.append)) == 2500
    assert [(record["phase"], record["done"], record["total"]) for record in made] == [
        (IMAGES_PHASE, done, 2500) for done in (1000, 2000, 2500)]

    def objective(model):  # DAFL's, on fresh images
        features = baseline.features(generate(model, 256, 1, "cpu"))
        return sum(data_free_terms(baseline.classify(features), features, 1.0, 5.0, 0.1, 1).values()).item()

    # measured over generator seeds 0-7 on one teacher: the objective falls by 0.63 to 3.50 (the balance term
    # nearly to its optimum, -5 log 10); the untrained generator's value itself spreads over 3
    assert objective(generator) < objective(untrained) - 0.3, (objective(generator), objective(untrained))
    assert torch.equal(generate(generator, 5, 3, "cpu"), generate(generator, 5, 3, "cpu"))


def test_the_generator_ends_in_dafls_batchnorm_and_can_match_the_baselines_statistics(digits_teacher: Path):
    from dpdistill.losses.generator import FeatureStatistics
    from dpdistill.models.ensemble import load_teacher

    baseline, _ = load_teacher(digits_teacher)
    config = DataFreeConfig(steps=60, batch_size=64, width=(16, 8, 8), batchnorm_weight=1.0)

    def distance(model):  # from the baseline's BatchNorm statistics, on fresh images
        with FeatureStatistics.of_batchnorm(baseline) as statistics:
            baseline.features(generate(model, 256, 1, "cpu"))
        return statistics.loss().item()

    untrained, _ = train_data_free_generator(baseline, (1, 8, 8), dataclasses.replace(config, steps=1), 0, "cpu")
    generator, report = train_data_free_generator(baseline, (1, 8, 8), config, 0, "cpu")
    assert isinstance(generator.body[-1], torch.nn.BatchNorm2d) and "batchnorm" in report["terms"]
    assert distance(generator) < distance(untrained), (distance(generator), distance(untrained))


def test_faithful_dgd_has_no_formal_guarantee_and_resumes_on_the_same_images(digits_ensemble: Path,
                                                                               digits_teacher: Path, tmp_path: Path,
                                                                               monkeypatch):
    config = build_dgd_config(1.0, baseline=str(digits_teacher), settings=TINY, preset="paper")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pate_module, "train_student", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dgd(digits_ensemble, config, tmp_path)
    state = tmp_path / "private" / "resume"
    released = Answers.load(state / ANSWERS_FILE, 27)
    assert (state / GENERATOR_STATE).exists()
    monkeypatch.undo()

    def asked_again(self, images):
        raise AssertionError("the ensemble was asked again: the budget would be spent twice")

    monkeypatch.setattr(TeacherEnsemble, "member_logits", asked_again)
    report = dgd(digits_ensemble, None, tmp_path, resume=True)
    privacy = report["privacy"]
    assert privacy["formal_guarantee"] is False and privacy["covered"].startswith("NO formal guarantee")
    assert "non-private baseline" in privacy["uncovered_reads"][0]["read"]
    assert report["labelling_query"] == DiscreteLaplaceQuery.__name__
    assert 0.6 < privacy["epsilon"] < 0.7  # LNMax at scale 40, 27 answers: what the answers alone spend
    assert privacy["paper_epsilon"] == pytest.approx(27 * 0.05**2 + 0.05 * math.sqrt(54 * math.log(1e5)) + 0.01)
    assert privacy["paper_epsilon"] == pytest.approx(paper_epsilon(27, 40, 1e-5))
    assert torch.equal(Answers.load(tmp_path / ANSWERS_FILE, 27).indices, released.indices)
    assert report["generative"]["images"] == 300 and report["resumed"]
    markdown = (tmp_path / "report.md").read_text()
    assert "**NO formal guarantee**" in markdown and "paper formula" in markdown and "Generative stream" in markdown
    assert (tmp_path / "samples.png").exists() and not state.exists()


def test_covered_dgd_composes_with_its_source_within_the_budget(digits_ensemble: Path, tmp_path: Path):
    digits = load_dataset("digits")
    source = write_sample_source(tmp_path / "source", digits.x_train[:300].numpy(), digits.y_train[:300].numpy(),
                                 noise_multiplier=4.0)
    settings = {**{key: value for key, value in TINY.items() if key != "synthetic_size" and "generator" not in key},
                "queries": 50}
    report = dgd(digits_ensemble, build_dgd_config(10.0, sample_source=str(source), settings=settings,
                                                   preset="paper"), tmp_path / "run")
    privacy = report["privacy"]
    assert privacy.get("formal_guarantee", True) and "paper_epsilon" not in privacy
    assert privacy["route_epsilon"] < privacy["epsilon"] <= 10 + 1e-9
    assert privacy["sample_source"]["epsilon"] > 0 and report["labelling_query"] != DiscreteLaplaceQuery.__name__
    assert report["generative"] == {} and "Generative stream" not in (tmp_path / "run" / "report.md").read_text()
    assert SELECTION not in privacy  # the seed's settings: chosen on no data here


def test_the_fixed_preset_says_in_every_run_that_it_was_chosen_on_fashion_mnist(digits_ensemble: Path,
                                                                                tmp_path: Path):
    fixed = build_dgd_config(10.0, baseline="b")
    [note] = selection_notes((FIXED_SELECTION,), fixed.settings(), FASHION_MNIST)
    assert note.startswith("the settings of DGD's `fixed` preset were chosen on Fashion-MNIST (a control of exact "
                           "votes, without noise), which is this private data")
    assert selection_notes((FIXED_SELECTION,), build_dgd_config(10.0, baseline="b", preset="paper").settings(),
                           FASHION_MNIST) == []
    digits = load_dataset("digits")
    source = write_sample_source(tmp_path / "source", digits.x_train[:300].numpy(), digits.y_train[:300].numpy(),
                                 noise_multiplier=4.0)
    settings = {"batch_size": 16, "queries": 50, "epochs": 1}
    report = dgd(digits_ensemble, build_dgd_config(10.0, sample_source=str(source), settings=settings),
                 tmp_path / "run")
    public = ("the settings of DGD's `fixed` preset were chosen on Fashion-MNIST (a control of exact votes, without "
              "noise): a fixed public choice for this data")
    assert report["privacy"][SELECTION] == [public] and public in (tmp_path / "run" / "report.md").read_text()


def test_a_baseline_that_is_an_ensemble_is_refused_before_any_answer(digits_ensemble: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match="holds an ensemble"):
        dgd(digits_ensemble, build_dgd_config(1.0, baseline=str(digits_ensemble), settings=TINY), tmp_path / "run")
    with pytest.raises(ConfigError, match="not a directory"):
        dgd(digits_ensemble, build_dgd_config(1.0, baseline=str(tmp_path / "none"), settings=TINY), tmp_path / "run")
    assert not (tmp_path / "run" / "private").exists()


def test_the_default_presets_batchnorm_term_refuses_a_baseline_without_batchnorm_before_any_write(
        digits_ensemble: Path, digits_dp_teacher: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match="no BatchNorm layers.*--preset paper or --set generator_batchnorm_weight=0"):
        dgd(digits_ensemble, build_dgd_config(1.0, baseline=str(digits_dp_teacher), settings=TINY), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_faithful_dgd_records_its_read_of_the_baseline_in_the_baselines_ledger(digits_ensemble: Path,
                                                                               digits_teacher: Path, tmp_path: Path):
    baseline = Path(shutil.copytree(digits_teacher, tmp_path / "baseline",  # without other tests' releases
                                    ignore=shutil.ignore_patterns("ledger.json", ".ledger.lock", ".lock")))
    dgd(digits_ensemble, build_dgd_config(1.0, baseline=str(baseline), settings=TINY, preset="paper"),
        tmp_path / "run")
    [entry] = ReleaseLedger(baseline).read().entries
    assert (entry.method, entry.status, entry.release.event) == ("dgd", "spent", dp_accounting.NonPrivateDpEvent())
    with pytest.raises(BudgetExceededError, match="spent epsilon=inf"):
        ReleaseLedger(baseline).set_total(10.0)


def test_the_control_asks_about_every_image_without_noise_and_says_it_is_not_private(digits_ensemble: Path,
                                                                                     digits_teacher: Path,
                                                                                     tmp_path: Path):
    config = build_dgd_config(None, baseline=str(digits_teacher),
                              settings={**TINY, "vote_noise": "none", "answer_targets": "shares"}, preset="paper")
    assert (config.labelling.queries, config.labelling.sigma) == (TINY["synthetic_size"], None)
    report = dgd(digits_ensemble, config, tmp_path)
    privacy = report["privacy"]
    assert (privacy["mode"], privacy["epsilon"], privacy["formal_guarantee"]) == ("none", math.inf, False)
    assert "paper_epsilon" not in privacy and any("without noise" in read["read"]
                                                  for read in privacy["uncovered_reads"])
    answers = Answers.load(tmp_path / ANSWERS_FILE, TINY["synthetic_size"])
    assert torch.equal(answers.votes.sum(1), torch.full((TINY["synthetic_size"],), 4.0))  # each member's one vote
    assert "NO privacy guarantee: a control" in (tmp_path / "report.md").read_text()
