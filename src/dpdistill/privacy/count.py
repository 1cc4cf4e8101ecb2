"""A training set's size as a public figure where the data declare none: one noisy count, released once.

DP-SGD's sampling rate and number of steps are released (the accountant needs them, and the report states them),
and both follow the training set's size: planned on the exact count they would release it without noise, and one
example added or removed moves a count by one. A built-in data set's documented size, an .npz's `declared_size`
or `--dataset-size` are public figures; where the data have none, a run releases the count itself, once:

- Mechanism: the exact count plus discrete Laplace noise, P(k) proportional to exp(-|k| / scale), drawn by the run's
  secret noise source. A count has sensitivity 1, so the release is (1 / scale, 0)-DP: pure, with no delta. The
  scale is the smallest integer that keeps 1 / scale within the share of the run's epsilon given to the count.
- Post-processing: the noisy count is rounded to the noise's own order of magnitude (a scale of 100 rounds to
  hundreds, so the figure does not pretend to a precision it lacks) and kept at least at that unit.
- Composition: the training's sampling rate follows the released count, so the two compose adaptively. The
  training is calibrated to (epsilon - epsilon_count, delta) whatever the count came out as, and a pure
  (epsilon_count, 0) release followed by any (epsilon_t, delta) release chosen after it is (epsilon_count +
  epsilon_t, delta)-DP (basic composition holds adaptively: Dwork and Roth 2014, Theorem 3.16). The run's
  epsilon is that sum, under both relations: under replace-one neighbours a count does not change, so the figure
  there is an upper bound.
- Ledgers record the count as dp-accounting's two-bucket randomized response at epsilon_count, the pair that
  dominates every pure epsilon_count-DP mechanism (Kairouz, Oh and Viswanath 2015), so a ledger's exact
  composition stays sound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting

from dpdistill.errors import PrivacyParameterError
from dpdistill.privacy.randomness import NoiseSource

COUNT_SHARE = 0.01  # of a run's epsilon, the default share of a count where the data declare no size


@dataclass(frozen=True)
class NoisyCount:
    """The training set's count plus discrete Laplace noise of an integer `scale`: (1 / scale, 0)-DP."""

    scale: int

    def __post_init__(self) -> None:
        if not isinstance(self.scale, int) or self.scale < 1:
            raise PrivacyParameterError(f"a noisy count's scale must be a positive integer, got {self.scale!r}")

    @classmethod
    def within(cls, epsilon: float) -> "NoisyCount":
        """The least noise whose epsilon (1 / scale) is at most `epsilon`."""
        if not 0 < epsilon < math.inf:
            raise PrivacyParameterError(f"a noisy count needs a positive finite epsilon, got {epsilon}")
        return cls(math.ceil(1 / epsilon - 1e-9))

    @property
    def epsilon(self) -> float:
        """Pure DP: a count moves by at most one, against noise of scale `scale`."""
        return 1 / self.scale

    @property
    def unit(self) -> int:
        """What the released figure is rounded to: the power of ten at or below the scale."""
        return 10 ** int(math.log10(self.scale))

    def release(self, count: int, noise: NoiseSource) -> int:
        """The noisy count, rounded to `unit`, at least `unit`."""
        noisy = count + int(noise.discrete_laplace((1,), self.scale)[0])
        return max(self.unit, self.unit * round(noisy / self.unit))

    def dp_event(self) -> dp_accounting.DpEvent:
        """Two-bucket randomized response at the same epsilon: it dominates any pure epsilon-DP release."""
        return dp_accounting.RandomizedResponseDpEvent(2 / (math.exp(self.epsilon) + 1), 2)

    def describe(self, released: int) -> str:
        """One sentence for a report: what the figure is and what it cost."""
        return (f"{released:,}, a noisy count of the training set (discrete Laplace noise of scale {self.scale}, "
                f"rounded to {self.unit:,}): epsilon {self.epsilon:.4g} (pure), added to the training's")
