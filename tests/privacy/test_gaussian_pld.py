"""The subsampled Gaussian's PLD built on whole grids is dp-accounting's own: the same PMF and the same epsilon as
its `PLDAccountant`, under both relations, with and without subsampling, at the boundaries of the subsampled loss."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_mechanism
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType

from dpdistill.privacy.gaussian_pld import GridGaussianPrivacyLoss, sampled_gaussian_pld

RELATIONS = {False: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
             True: dp_accounting.NeighboringRelation.REPLACE_ONE}


@pytest.mark.parametrize("adjacency", [AdjacencyType.ADD, AdjacencyType.REMOVE, AdjacencyType.REPLACE])
@pytest.mark.parametrize("sigma, q", [(1.0, 0.05), (0.6, 0.999), (2.0, 1.0), (0.3, 0.2)])
def test_each_grid_point_has_dp_accountings_divergence(adjacency, sigma, q):
    scalar = privacy_loss_mechanism.GaussianPrivacyLoss(sigma, sampling_prob=q, adjacency_type=adjacency)
    grid = GridGaussianPrivacyLoss(sigma, sampling_prob=q, adjacency_type=adjacency)
    bounds = scalar.connect_dots_bounds()
    # the whole connect-the-dots range, the loss 0, and (subsampled) both sides of the loss's bound -log(1 - q)
    epsilons = np.concatenate([np.linspace(bounds.epsilon_lower, bounds.epsilon_upper, 2001), [0.0]])
    if q < 1:
        edge = -math.log1p(-q)
        epsilons = np.concatenate([epsilons, [edge, -edge, edge * (1 - 1e-12), -edge * (1 - 1e-12), edge + 1]])
    expected = np.array([scalar.get_delta_for_epsilon(float(epsilon)) for epsilon in epsilons])
    np.testing.assert_allclose(grid.get_delta_for_epsilon(epsilons), expected, rtol=1e-12, atol=1e-300)
    assert grid.get_delta_for_epsilon(float(epsilons[0])) == expected[0]  # a single epsilon: dp-accounting's path


@pytest.mark.parametrize("replace_one", [False, True])
@pytest.mark.parametrize("sigma, q, steps", [(1.0, 64 / 1437, 44), (0.8, 0.004, 2000), (3.0, 1.0, 5)])
def test_the_pld_and_its_epsilon_are_dp_accountings(replace_one, sigma, q, steps):
    relation = RELATIONS[replace_one]
    ours = sampled_gaussian_pld(sigma, q, 1e-3, replace_one)
    theirs = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=1e-3,
                                             neighboring_relation=relation)
    for mine, reference in ((ours._pmf_remove, theirs._pmf_remove), (ours._pmf_add, theirs._pmf_add)):
        assert (mine._lower_loss, mine._infinity_mass) == (reference._lower_loss, reference._infinity_mass)
        # each probability is a difference of neighbouring divergences: the last bits of the cut-offs (numpy's
        # vectorised exp and log against libm's scalar ones, which differ by CPU) show up absolutely, near
        # 1e-13, and relatively up to 1e-8 in the small probabilities (measured on an AVX-512 machine)
        np.testing.assert_allclose(mine._probs, reference._probs, rtol=1e-12, atol=1e-11)
    accountant = pld_privacy_accountant.PLDAccountant(relation, value_discretization_interval=1e-3)
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    assert ours.self_compose(steps).get_epsilon_for_delta(1e-5) == pytest.approx(accountant.get_epsilon(1e-5),
                                                                               rel=1e-9)
