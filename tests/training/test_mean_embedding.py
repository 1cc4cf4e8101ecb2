"""DP-MERF-style mean embeddings: the embedding's norm bound that the sensitivity rests on, the one release's
noise and accounting, the fit towards the released means, and a resumed run that never releases twice."""

import math

import dp_accounting
import pytest
import torch

from dpdistill.data import load_dataset
from dpdistill.errors import ConfigError
from dpdistill.privacy.randomness import noise_source
from dpdistill.training import state
from dpdistill.training.mean_embedding import (EMBEDDING_PARTS, FIT_PHASE, SENSITIVITY, SUMS_PHASE, Embedding,
                                               MeanEmbeddingConfig, MeanEmbeddingSynthesizer, plan_mean_embedding)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def config(**values) -> MeanEmbeddingConfig:
    return MeanEmbeddingConfig(**{"dataset": "digits", "epsilon": 1.0, "rff_features": 64, "synthetic_size": 100,
                                  "steps": 20, "batch_per_class": 5, **values})


@pytest.mark.parametrize("parts", [EMBEDDING_PARTS, ("pixel-rff",), ("scattering",), ("scattering-rff", "pixel-rff")])
def test_every_embedding_has_norm_one_whatever_the_image(digits, parts):
    """The sensitivity bound rests on it: extreme, random and real images alike."""
    embedding = Embedding(digits.input_shape, config(embedding=parts))
    images = torch.cat([digits.x_train[:20], torch.rand(20, 1, 8, 8) * 2 - 1, torch.ones(2, 1, 8, 8),
                        -torch.ones(2, 1, 8, 8)])
    with torch.no_grad():
        norms = embedding(images).norm(dim=1)
    assert norms == pytest.approx(torch.ones(len(images)), abs=1e-5)


def class_sums(embedding: Embedding, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.zeros(10, embedding.dim).index_add_(0, labels, embedding(images))


def test_replacing_one_example_moves_the_class_sums_by_at_most_the_sensitivity(digits):
    """Same class (one row moves by phi(x') - phi(x)) and another class (two rows move): both within 2."""
    embedding = Embedding(digits.input_shape, config())
    images, labels = digits.x_train[:200].clone(), digits.y_train[:200].clone()
    before = class_sums(embedding, images, labels)
    worst = 0.0
    for replacement, label in [(-torch.ones(1, 8, 8), labels[0]), (torch.ones(1, 8, 8), (labels[0] + 1) % 10),
                               (digits.x_test[0], digits.y_test[0])]:
        changed_images, changed_labels = images.clone(), labels.clone()
        changed_images[0], changed_labels[0] = replacement, label
        worst = max(worst, float((class_sums(embedding, changed_images, changed_labels) - before).norm()))
    assert 0.5 < worst <= SENSITIVITY + 1e-5


def test_the_release_is_one_gaussian_mechanism_within_the_budget():
    plan = plan_mean_embedding(config(epsilon=1.0))
    assert plan.sigma == pytest.approx(SENSITIVITY * plan.query.noise_multiplier)
    # the multiplier is std / replace-one sensitivity, so the exact figure is the unit-sensitivity Gaussian's
    exact = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    exact.compose(dp_accounting.GaussianDpEvent(plan.query.noise_multiplier))
    assert 0.999 <= exact.get_epsilon(1e-5) <= 1.0  # calibrated from above, within 1e-4 relative
    summary = plan.summary(1e-5)
    assert summary["epsilon"] <= 1.0 and summary["epsilon_add_remove"] < summary["epsilon"]


def test_the_release_adds_secret_noise_of_the_planned_std(digits, tmp_path):
    synthesizer = MeanEmbeddingSynthesizer(config(), digits, plan_mean_embedding(config()), noise_source(),
                                           tmp_path)
    clean = class_sums(synthesizer.embedding, digits.x_train, digits.y_train)
    first, second = synthesizer.release(), synthesizer.release()
    noise = (first - clean).flatten()
    assert noise.std().item() == pytest.approx(synthesizer.plan.sigma, rel=0.05)  # ~2,600 coordinates
    assert abs(noise.mean().item()) < 4 * synthesizer.plan.sigma / math.sqrt(len(noise))
    assert not torch.equal(first, second)  # secure noise: not derived from the seed


def test_released_means_are_the_class_means_when_the_noise_is_negligible(digits, tmp_path):
    loose = config(epsilon=1e7)
    synthesizer = MeanEmbeddingSynthesizer(loose, digits, plan_mean_embedding(loose), noise_source(), tmp_path)
    targets = synthesizer.targets(synthesizer.release())
    with torch.no_grad():
        first_class = synthesizer.embedding(digits.x_train[digits.y_train == 0]).mean(0)
    assert targets[0] == pytest.approx(first_class, abs=1e-4)


def test_fitting_moves_each_class_towards_its_released_mean(digits, tmp_path):
    run, records = config(epsilon=100.0, steps=40), []
    result = MeanEmbeddingSynthesizer(run, digits, plan_mean_embedding(run), noise_source(), tmp_path,
                                      records.append).run(False)
    summed = [record for record in records if record.get("phase") == SUMS_PHASE]
    assert summed[-1]["done"] == summed[-1]["total"] == len(digits.y_train) and records[-1]["step"] == 40
    assert result.history[-1]["distance"] < 0.5 * result.history[0]["distance"]
    assert result.images.abs().max() <= 1 and torch.bincount(result.labels).tolist() == [10] * 10


class CountingNoise:
    """The secure source, counting its Gaussian draws."""

    def __init__(self, source=None) -> None:
        self.source, self.draws = source or noise_source(), 0
        self.description = self.source.description

    def normal(self, *args, **kwargs):
        self.draws += 1
        return self.source.normal(*args, **kwargs)


def test_a_resumed_run_fits_to_the_saved_release_without_a_second_one(digits, tmp_path):
    run = config(steps=30, checkpoint_every=10)
    noise = CountingNoise()
    interrupted = MeanEmbeddingSynthesizer(run, digits, plan_mean_embedding(run), noise, tmp_path)
    interrupted.config = config(steps=15, checkpoint_every=10)  # stops after its checkpoint at step 10
    interrupted.run(False)
    resumed = MeanEmbeddingSynthesizer(run, digits, plan_mean_embedding(run), noise, tmp_path)
    result = resumed.run(True)
    assert noise.draws == 1 and result.history[-1]["step"] == 30


def test_an_interrupted_fit_resumes_from_its_last_timed_checkpoint_with_the_saved_release(digits, tmp_path,
                                                                                         monkeypatch):
    """No step count reaches a checkpoint (checkpoint_every 1,000), but the time does (CHECKPOINT_SECONDS 0 here:
    after every step): the fit resumes after the step it was stopped at, exactly as it would have gone on, and
    fits to the release saved before the first step, never drawing the noise again."""
    monkeypatch.setattr(state, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(state, "SAVE_SHARE", float("inf"))  # a save's own cost not counted
    run = config(steps=12, checkpoint_every=1000, reproducible_noise=True)
    whole = MeanEmbeddingSynthesizer(run, digits, plan_mean_embedding(run), noise_source(True, 0),
                                     tmp_path / "whole").run(False)

    def stop_at_step_7(record: dict) -> None:
        if record.get("phase") == FIT_PHASE and record["step"] == 7:
            raise KeyboardInterrupt

    noise = CountingNoise(noise_source(True, 0))
    with pytest.raises(KeyboardInterrupt):
        MeanEmbeddingSynthesizer(run, digits, plan_mean_embedding(run), noise, tmp_path / "cut",
                                 stop_at_step_7).run(False)
    records: list[dict] = []
    resumed = MeanEmbeddingSynthesizer(run, digits, plan_mean_embedding(run), noise, tmp_path / "cut",
                                       records.append).run(True)
    assert [record["step"] for record in records] == list(range(8, 13)) and noise.draws == 1
    assert torch.equal(resumed.images, whole.images) and resumed.history == whole.history


@pytest.mark.parametrize("values, message", [
    ({"embedding": ("pixels",)}, "distinct parts"),
    ({"embedding": ()}, "distinct parts"),
    ({"steps": 0}, "steps must be at least 1"),
    ({"pixel_bandwidth": 0.0}, "must be positive"),
    ({"method": "datalens"}, "for dp-merf"),
])
def test_bad_settings_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        config(**values)
