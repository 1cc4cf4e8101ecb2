"""TopAgg (DataLens): every teacher's vote vector has k signs whatever the gradient and the coins (so one teacher
moves the sum by at most 2 sqrt(k)), the signs are unbiased, the noisy vote is thresholded as the paper says, and
each sample's release is accounted as a Gaussian of multiplier sigma / (2 sqrt(k)). Statistical tests reject at
p < 1e-6."""

import math

import dp_accounting
import numpy as np
import pytest
import scipy.stats
import torch

from dpdistill.errors import BudgetExceededError, PrivacyParameterError
from dpdistill.privacy.mechanisms import thresholded_noisy_votes, top_k_stochastic_signs
from dpdistill.privacy.randomness import SecureNoise
from dpdistill.training.datalens import DataLensConfig, plan_datalens, topagg_query
from helpers import gdp_epsilon

REJECT = 1e-6


def test_every_row_votes_exactly_k_signs_so_two_teachers_differ_by_at_most_two_sqrt_k():
    gradients = torch.cat([torch.randn(200, 50) * 1e3, torch.randn(200, 50) * 1e-9, torch.zeros(5, 50)])
    signs = top_k_stochastic_signs(gradients, k=7, clip=1e-5)
    assert set(signs.unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert ((signs != 0).sum(1) == 7).all()
    assert torch.allclose(signs.norm(dim=1), torch.full((len(signs),), math.sqrt(7)))
    worst = (signs[:, None] - signs[None]).norm(dim=-1).max()
    assert worst <= 2 * math.sqrt(7) + 1e-6


def test_signs_fall_on_the_largest_entries():
    gradients = torch.zeros(3, 10)
    gradients[:, [2, 5]] = torch.tensor([4.0, -3.0])
    gradients[:, 7] = 0.1
    signs = top_k_stochastic_signs(gradients, k=2, clip=10.0)
    assert ((signs != 0).nonzero()[:, 1].view(3, 2).sort(1).values == torch.tensor([2, 5])).all()


def test_stochastic_signs_are_unbiased_for_the_scaled_entry():
    """P(+1) = (1 + g / scale) / 2 with scale the largest kept magnitude after clipping."""
    row = torch.tensor([[1.0, -0.5, 0.25, 0.0, 0.0]])
    draws = 40000
    signs = top_k_stochastic_signs(row.expand(draws, -1), k=3, clip=10.0, generator=torch.Generator().manual_seed(3))
    for column, value in ((0, 1.0), (1, -0.5), (2, 0.25)):
        ups = int((signs[:, column] == 1).sum())
        p = (1 + value) / 2
        assert scipy.stats.binomtest(ups, draws, p).pvalue > REJECT or p in (0.0, 1.0) and ups == draws * p
    clipped = top_k_stochastic_signs(torch.tensor([[8.0, -2.0]]).expand(draws, -1), k=2, clip=4.0,
                                     generator=torch.Generator().manual_seed(4))
    assert (clipped[:, 0] == 1).all()  # clipped to 4, the scale: always +1
    assert scipy.stats.binomtest(int((clipped[:, 1] == 1).sum()), draws, 0.25).pvalue > REJECT


def test_thresholded_votes_keep_a_sign_where_the_noisy_sum_reaches_the_threshold():
    noise = SecureNoise()
    sigma, threshold, count = 10.0, 15.0, 200000
    kept = thresholded_noisy_votes(torch.zeros(count), sigma, threshold, noise)
    expected = 2 * scipy.stats.norm.sf(threshold / sigma)
    assert scipy.stats.binomtest(int((kept != 0).sum()), count, expected).pvalue > REJECT
    assert abs(int((kept == 1).sum()) - int((kept == -1).sum())) < 6 * math.sqrt(count * expected)
    strong = thresholded_noisy_votes(torch.tensor([500.0, -500.0, 0.0]), 1.0, 15.0, noise)
    assert strong.tolist() == [1.0, -1.0, 0.0]
    with pytest.raises(PrivacyParameterError):
        thresholded_noisy_votes(torch.zeros(3), 0.0, 1.0, noise)


def test_each_sample_is_a_gaussian_of_multiplier_sigma_over_two_sqrt_k():
    assert topagg_query(5000.0, 200).noise_multiplier == pytest.approx(5000 / (2 * math.sqrt(200)))
    config = DataLensConfig(dataset="fmnist", epsilon=10.0, sigma=1000.0, top_k=350, batch_size=15)
    plan = plan_datalens(config)
    z = 1000 / (2 * math.sqrt(350))
    assert plan.epsilon(1e-5) == pytest.approx(gdp_epsilon(math.sqrt(plan.queries) / z, 1e-5), rel=1e-6)
    assert plan.epsilon(1e-5) <= 10 < gdp_epsilon(math.sqrt(plan.queries + config.batch_size) / z, 1e-5)
    event = plan.release_event()
    assert event == dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), plan.queries)


def test_the_rdp_figure_is_the_official_bound_and_never_below_the_exact_one():
    """The official code's 2 k lambda / sigma^2 per query, converted with log(1/delta) / (lambda - 1), bounds the
    RDP figure dp-accounting gives (it converts more tightly), which in turn bounds the exact Gaussian figure."""
    config = DataLensConfig(dataset="fmnist", epsilon=1.0, sigma=5000.0, top_k=200, batch_size=15)
    plan = plan_datalens(config)
    summary = plan.summary(1e-5)
    orders = np.linspace(1.01, 400, 200000)
    official = (plan.queries * 2 * 200 * orders / 5000**2 + math.log(1e5) / (orders - 1)).min()
    assert summary["epsilon"] <= summary["epsilon_rdp"] <= official + 1e-6
    assert plan.steps * 15 == plan.queries and summary["epsilon"] <= 1.0


def test_a_plan_never_spends_more_than_its_budget():
    fitted = plan_datalens(DataLensConfig(dataset="fmnist", epsilon=2.0, sigma=None, steps=300, batch_size=30))
    assert fitted.steps == 300 and fitted.epsilon(1e-5) <= 2.0
    assert fitted.epsilon(1e-5) > 2.0 * 0.999  # calibrated: as little noise as fits
    with pytest.raises(BudgetExceededError, match="at most"):
        plan_datalens(DataLensConfig(dataset="fmnist", epsilon=1.0, sigma=5000.0, top_k=200, steps=10**6))
    with pytest.raises(BudgetExceededError, match="not one step"):
        plan_datalens(DataLensConfig(dataset="fmnist", epsilon=0.01, sigma=1.0, batch_size=1000))
