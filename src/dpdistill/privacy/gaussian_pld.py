"""dp-accounting's privacy-loss distribution (PLD) of the Poisson-subsampled Gaussian mechanism (a DP-SGD step),
built by dp-accounting's own algorithm, with the one step that dominates its cost done on arrays.

dp-accounting 0.6.0 builds this PLD by connect-the-dots: the hockey-stick divergence delta(eps) at every point of
a grid of privacy losses, from a cut-off x(eps) where the privacy loss crosses eps. It inverts the privacy loss at
each grid point in its own Python call, and a grid of step 1e-4 has 10^5 to 10^6 points: over a second for each
figure of a run with little noise, two thirds of it in that loop. `GridGaussianPrivacyLoss`
computes the same cut-offs with the same formulas on the whole grid at once; everything else (truncation, the
pessimistic connect-the-dots PMF, composition, epsilon) is dp-accounting's, unchanged, through two of its internal
builders (`_create_pld_pmf_from_monotone_privacy_loss`, `_pld_for_subsampled_mechanism`: the project pins
dp-accounting 0.6.0). The PMFs equal `from_gaussian_mechanism`'s up to the last bits of the exp and log functions
(each probability within 1e-11; measured up to 4.4e-13 absolute) and the epsilons `PLDAccountant`'s within 1e-9
relative (measured up to 5e-11; tests/privacy/test_gaussian_pld.py checks both relations against them).
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType


class GridGaussianPrivacyLoss(privacy_loss_mechanism.GaussianPrivacyLoss):
    """dp-accounting's privacy loss of the (subsampled) Gaussian mechanism, whose divergence over a grid of epsilons
    inverts the privacy loss as one array operation (dp-accounting's formulas: `_inverse_privacy_loss_add`,
    `_remove` and `GaussianPrivacyLoss._inverse_privacy_loss_replace`)."""

    def get_delta_for_epsilon(self, epsilon: float | Sequence[float]) -> float | np.ndarray:
        if isinstance(epsilon, numbers.Number):
            return super().get_delta_for_epsilon(epsilon)
        epsilons = np.asarray(epsilon, dtype=float)
        deltas = np.zeros_like(epsilons)
        q = self.sampling_prob
        if q == 1.0 or self.adjacency_type == AdjacencyType.REPLACE:
            inverted = np.full(epsilons.shape, True)
        elif self.adjacency_type == AdjacencyType.ADD:
            inverted = epsilons < -math.log1p(-q)  # beyond it the divergence is 0
        else:
            inverted = epsilons > math.log1p(-q)
            deltas[~inverted] = -np.expm1(epsilons[~inverted])
        cut = self._inverse_privacy_losses(epsilons[inverted])
        deltas[inverted] = self.mu_upper_cdf(cut) - np.exp(epsilons[inverted] + self.mu_lower_log_cdf(cut))
        return np.clip(deltas, 0, 1)

    def _inverse_privacy_losses(self, losses: np.ndarray) -> np.ndarray:
        """The largest x whose privacy loss is at least each of `losses`."""
        if self.adjacency_type == AdjacencyType.REPLACE:
            return self._inverse_replace(losses)
        q, add = self.sampling_prob, self.adjacency_type == AdjacencyType.ADD
        unsampled = losses  # the loss of the mechanism without subsampling that has the same cut-off
        if q < 1.0:
            bound = -math.log(1 - q) if add else math.log(1 - q)  # the subsampled loss's supremum (infimum)
            at_bound = np.abs(losses - bound) <= 1e-9 * np.maximum(np.abs(losses), abs(bound))  # math.isclose
            if np.any(((losses > bound) if add else (losses <= bound)) & ~at_bound):
                raise ValueError(f"a privacy loss lies beyond the subsampled mechanism's bound {bound}")
            unsampled = np.full(losses.shape, math.inf if add else -math.inf)
            inside = losses[~at_bound]
            # ADD: -log(1 + (exp(-loss) - 1) / q); REMOVE: log(1 + (exp(loss) - 1) / q)
            unsampled[~at_bound] = (-_log_a_exp_b_plus_c(1 / q, -inside, 1 - 1 / q) if add
                                    else _log_a_exp_b_plus_c(1 / q, inside, 1 - 1 / q))
        cut = -0.5 * self.sensitivity - unsampled * (self._standard_deviation**2) / self.sensitivity
        return cut + self.sensitivity if add else cut

    def _inverse_replace(self, losses: np.ndarray) -> np.ndarray:
        q, sd, sensitivity = self.sampling_prob, self._standard_deviation, self.sensitivity
        if q == 1.0:
            return np.where(losses == 0, 0.0, -losses * sd**2 / sensitivity / 2)
        half = np.abs(losses) / 2
        sign = np.where(losses >= 0, 1.0, -1.0)
        log_alpha = 0.5 * (sensitivity / sd) ** 2 + math.log1p(-q) - math.log(q)
        with np.errstate(divide="ignore"):  # log sinh(0) is dp-accounting's 0 there, and the loss 0 inverts to 0
            log_sinh = np.where(half == 0, 0.0, half + np.log1p(-np.exp(-2 * half)) - math.log(2))
        a = log_alpha + log_sinh
        asinh = -sign * np.logaddexp(0.5 * np.logaddexp(0, 2 * a), a)  # asinh(-sign exp(a))
        return np.where(losses == 0, 0.0, sd**2 / sensitivity * (asinh - losses / 2))


def _log_a_exp_b_plus_c(a: float, b: np.ndarray, c: float) -> np.ndarray:
    """log(a exp(b) + c) for a > 0 > c, as dp-accounting's `common.log_a_times_exp_b_plus_c`."""
    d = b + np.log(a)
    log_minus_c = np.log(-c)
    if np.any((log_minus_c >= d) & (b != 0)):
        raise ValueError("a exp(b) + c must be positive")
    with np.errstate(invalid="ignore", divide="ignore"):  # where b is 0 the other branch is taken
        return np.where(b == 0, np.log(a + c), d + np.log1p(-np.exp(log_minus_c - d)))


def sampled_gaussian_pld(noise_multiplier: float, sampling_prob: float, discretization: float,
                         replace_one: bool) -> pld_lib.PrivacyLossDistribution:
    """One step's PLD, as `pld_lib.from_gaussian_mechanism(noise_multiplier, sampling_prob=...)` builds it
    (sensitivity 1, pessimistic connect-the-dots, tail mass e^-50), on `GridGaussianPrivacyLoss`."""

    def single(adjacency: AdjacencyType):
        loss = GridGaussianPrivacyLoss(noise_multiplier, sampling_prob=sampling_prob, adjacency_type=adjacency)
        return pld_lib._create_pld_pmf_from_monotone_privacy_loss(
            loss, value_discretization_interval=discretization, use_connect_dots=True)

    if replace_one:
        return pld_lib.PrivacyLossDistribution(single(AdjacencyType.REPLACE))
    return pld_lib._pld_for_subsampled_mechanism(single, sampling_prob)
