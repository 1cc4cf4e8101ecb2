"""Annotators: an ensemble's bounded answers are summed before one noise draw; its labels are noisy votes."""

import pytest
import torch

import torch.nn.functional as F

from dpdistill.losses.distillation import probability_loss
from dpdistill.training.annotation import (CandidateSet, DistillationGradient, NoisyVoteAnnotator,
                                          OutputGradientAnnotator, TeacherAnnotator, gradient_targets)
from dpdistill.privacy.accounting import GaussianQuery, PrivacyLedger
from dpdistill.privacy.randomness import SecureNoise


def _gradient_annotator(sigma: float) -> OutputGradientAnnotator:
    ledger = PrivacyLedger(GaussianQuery(sigma / 2), max_queries=10**6)
    return OutputGradientAnnotator(DistillationGradient("kd"), ledger, beta=1.0, sigma=sigma, top_k=None, step=0.1,
                                   noise=SecureNoise())


def _released_step(targets: torch.Tensor, student: torch.Tensor, step: float = 0.1) -> torch.Tensor:
    """What moved the student's logits (up to a per-row constant): (z - log y) / step, centred per row."""
    shift = (student - targets.log()) / step
    return shift - shift.mean(1, keepdim=True)


def test_an_ensemble_of_m_agreeing_teachers_divides_the_noise_by_m():
    torch.manual_seed(0)
    student, teacher = torch.randn(4000, 10), torch.randn(4000, 10)
    single = _gradient_annotator(sigma=50.0).annotate(teacher, student)
    ensemble = _gradient_annotator(sigma=50.0).annotate(teacher.expand(4, -1, -1), student)
    ratio = _released_step(single, student).std() / _released_step(ensemble, student).std()
    assert ratio == pytest.approx(4.0, rel=0.05)


def test_without_noise_an_ensemble_releases_the_mean_of_its_bounded_answers():
    torch.manual_seed(1)
    student, members = torch.randn(50, 10), torch.randn(3, 50, 10)
    annotator = _gradient_annotator(sigma=1e-6)
    together = _released_step(annotator.annotate(members, student), student)
    alone = torch.stack([_released_step(annotator.annotate(m, student), student) for m in members]).mean(0)
    assert torch.allclose(together, alone, atol=1e-3)
    assert annotator.ledger.answered == 50 + 3 * 50  # one query per sample, whatever the ensemble's size


def test_noisy_votes_count_each_members_top_class():
    members = torch.zeros(5, 2, 4)
    members[:3, :, 1] = 5.0  # three members vote class 1
    members[3:, :, 2] = 5.0  # two vote class 2
    student = torch.tensor([[0.0, 3.0, 2.0, 1.0], [0.0, 1.0, 3.0, 2.0]])
    ledger = PrivacyLedger(GaussianQuery(1e-3), max_queries=10)
    labels = NoisyVoteAnnotator(ledger, 1e-3, CandidateSet(2), SecureNoise()).annotate(members, student).argmax(1)
    assert labels.tolist() == [1, 2]  # the second sample's candidates are {2, 3}: class 1 is not offered
    assert ledger.answered == 2


def test_uncertain_noisy_votes_are_declined_but_still_charged():
    """Margin 2.5 votes: a 5-to-0 lead is labelled, a 3-to-2 lead is not (noise negligible)."""
    members = torch.zeros(5, 2, 3)
    members[:, 0, 0] = 5.0  # all five vote class 0 on the first sample
    members[:3, 1, 1] = 5.0  # three to two on the second
    members[3:, 1, 2] = 5.0
    ledger = PrivacyLedger(GaussianQuery(1e-3), max_queries=10)
    annotator = NoisyVoteAnnotator(ledger, 1e-3, CandidateSet(3), SecureNoise(), min_margin=2.5)
    targets = annotator.annotate(members, torch.zeros(2, 3))
    assert targets.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]] and ledger.answered == 2


def test_without_privacy_an_ensemble_teaches_its_mean_probability():
    """Members sure of class 0 (0.98) and undecided (0.5): the mean of their probabilities is 0.74, where a mean of
    their logits would say 0.875. The temperature divides the logits before the softmax."""
    temperature = 2.0
    members = temperature * torch.log(torch.tensor([[[0.98, 0.02]], [[0.5, 0.5]]]))
    targets = TeacherAnnotator(temperature).annotate(members, torch.zeros(1, 2))
    assert torch.allclose(targets, torch.tensor([[0.74, 0.26]]), atol=1e-6)
    single = TeacherAnnotator(temperature).annotate(members[0], torch.zeros(1, 2))
    assert torch.allclose(single, torch.tensor([[0.98, 0.02]]), atol=1e-6)


def test_candidates_are_the_top_k_or_every_class_above_the_threshold_and_at_least_two():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04], [0.96, 0.01, 0.01, 0.01, 0.01],
                                     [0.2, 0.2, 0.2, 0.2, 0.2]]))
    assert CandidateSet(3)(logits).sum(1).tolist() == [3, 3, 3]
    threshold = CandidateSet(3, threshold=0.05)(logits)
    assert threshold[0].tolist() == [True, True, True, True, False]
    assert threshold[1].sum() == 2 and threshold[1, 0]  # fewer than two above: the top two
    assert threshold[2].all()  # an undecided student offers every class


@pytest.mark.parametrize("sigma, beta", [(50.0, 1.0), (20.0, 0.25)])
def test_the_output_gradient_answer_carries_noise_of_std_sigma_times_beta(sigma: float, beta: float):
    """The absolute noise scale the accountant assumes (std sigma * beta per coordinate), read back from the released
    targets: each row's step is known up to a constant, so its centred noise has variance (1 - 1/C) (sigma beta)^2;
    the bounded answer (norm <= beta) is negligible beside it."""
    torch.manual_seed(2)
    n, classes, step = 4000, 10, 0.1 / sigma  # logits move by about 0.1 * noise / (sigma beta): no float saturation
    student, teacher = torch.randn(n, classes), torch.randn(n, classes)
    ledger = PrivacyLedger(GaussianQuery(sigma / 2), max_queries=n)
    annotator = OutputGradientAnnotator(DistillationGradient("kd"), ledger, beta=beta, sigma=sigma, top_k=None,
                                        step=step, noise=SecureNoise())
    released = _released_step(annotator.annotate(teacher, student), student, step)
    expected = sigma * beta * (1 - 1 / classes) ** 0.5
    assert released.std().item() == pytest.approx(expected, rel=0.02)  # 40,000 draws: standard error 0.4%
    assert ledger.answered == n


def test_eq_3_in_probability_space_moves_the_prediction_against_the_gradient_of_dkd_in_p():
    torch.set_default_dtype(torch.float64)
    try:
        generator = torch.Generator().manual_seed(0)
        teacher, student = torch.randn(6, 10, generator=generator) * 3, torch.randn(6, 10, generator=generator)
        gradient = DistillationGradient(space="probabilities")(teacher, student)
        probabilities, step = F.softmax(student, dim=1), 1e-6
        for column in range(10):  # the partial derivatives, each probability a free variable
            up, down = probabilities.clone(), probabilities.clone()
            up[:, column] += step
            down[:, column] -= step
            numeric = (probability_loss(up, teacher) - probability_loss(down, teacher)) / (2 * step)
            assert torch.allclose(gradient[:, column], numeric, rtol=1e-5, atol=1e-6)
        logit_gradient = DistillationGradient(space="logits")(teacher, student)
        assert not torch.allclose(gradient, logit_gradient)
        noisy = torch.randn(6, 10, generator=generator)
        assert torch.allclose(gradient_targets(student, noisy, 0.1, 2, "probabilities"), probabilities - 0.05 * noisy)
        assert torch.allclose(gradient_targets(student, noisy, 0.1, 2), F.softmax(student - 0.05 * noisy, dim=1))
    finally:
        torch.set_default_dtype(torch.float32)
