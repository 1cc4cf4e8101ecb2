"""Where privacy noise comes from: secret randomness from the operating system, never from `--seed`.

Differential privacy assumes the noise is secret. Noise drawn from a generator seeded by a released (or
guessable) value can be regenerated and subtracted, and the release is then a fixed function of the data. So every
privacy-relevant draw (Gaussian noise, randomized response, Poisson sampling, discrete Gaussian vote noise) comes
from a `NoiseSource`:

- `SecureNoise` (the default): bits from `os.urandom`, the operating system's cryptographically secure generator,
  fresh for every draw (the exact samplers' small integers come from a pool of its bytes read ahead, each byte used
  once). Nothing about it is stored, so nothing can be replayed, by a resumed run or by anyone else.
- `ReproducibleNoise` (debugging only, behind an explicit flag): the same draws from a seed. A run that uses it
  reports "NO guarantee: the noise is reproducible".

Samplers that resist the floating-point attacks on textbook ones (Mironov 2012; Jin et al. 2022):
- continuous Gaussian noise is the sum of four independent Box-Muller normals from 53-bit uniforms, halved
  (the construction of Opacus' secure mode): no single uniform passes through an invertible transform, so the
  set of reachable floats does not give the unnoised value away;
- integer-valued answers (vote counts) get an exact discrete Gaussian (Canonne, Kamath and Steinke 2020,
  Algorithm 3), computed in integer arithmetic only, with sigma rounded up to a multiple of 1e-6 (more noise than
  accounted for is always safe).
"""

from __future__ import annotations

import math
import os
import random
import weakref
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dpdistill.errors import PrivacyParameterError

GAUSSIAN_TERMS = 4  # normals summed per Gaussian draw (their sum is halved: variance unchanged)
SIGMA_RESOLUTION = 10**6  # discrete Gaussian: sigma is rounded up to a multiple of 1 / SIGMA_RESOLUTION
POOL_BYTES = 1 << 16  # os.urandom bytes a secure source reads at a time for small integers
SECURE_DESCRIPTION = ("secure: os.urandom (the operating system's cryptographic generator); Gaussian noise as the "
                      "halved sum of four Box-Muller normals, integer noise (vote counts, aggregation shares) from "
                      "exact discrete Gaussian or Laplace samplers")
REPRODUCIBLE_DESCRIPTION = "reproducible from the seed (debugging only): NO guarantee, the noise is reproducible"


class NoiseSource(ABC):
    """Random draws for privacy mechanisms. Subclasses supply raw bits and small uniform integers."""

    reproducible: bool
    description: str

    @abstractmethod
    def bits(self, count: int) -> np.ndarray:
        """`count` independent uniform 64-bit words (uint64)."""

    @abstractmethod
    def randbelow(self, bound: int) -> int:
        """A uniform integer in [0, bound), for the exact samplers' integer arithmetic."""

    def uniform(self, shape: torch.Size | tuple[int, ...]) -> Tensor:
        """float64 uniforms in the open interval (0, 1): 53 random bits, centred in their cell (never 0 or 1)."""
        words = torch.from_numpy(self.bits(math.prod(shape)).view(np.int64))
        return ((words >> 11) & (2**53 - 1)).double().add_(0.5).mul_(2.0**-53).reshape(shape)

    def normal(self, shape: torch.Size | tuple[int, ...], std: float, device: torch.device | str = "cpu") -> Tensor:
        """float32 N(0, std^2) noise of `shape` on `device`."""
        count = math.prod(shape)
        pairs = -(-GAUSSIAN_TERMS * count // 2)
        uniforms = self.uniform((2, pairs))
        radius, angle = uniforms[0].log_().mul_(-2.0).sqrt_(), uniforms[1].mul_(2.0 * math.pi)
        normals = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:GAUSSIAN_TERMS * count]
        summed = normals.view(GAUSSIAN_TERMS, count).sum(0) / math.sqrt(GAUSSIAN_TERMS)
        return (summed * std).to(torch.float32).reshape(shape).to(device)

    def bernoulli(self, shape: torch.Size | tuple[int, ...], probability: float) -> Tensor:
        """Boolean tensor, each entry True with `probability` (Poisson sampling)."""
        return self.uniform(shape) < probability

    def categorical(self, weights: Tensor) -> Tensor:
        """One index per row of the non-negative (n, k) `weights`, drawn with probability proportional to them."""
        cumulative = weights.detach().double().cpu().cumsum(1)
        threshold = self.uniform((len(weights), 1)) * cumulative[:, -1:]
        choice = (cumulative <= threshold).sum(1)
        return choice.clamp(max=weights.shape[1] - 1).to(weights.device)

    def discrete_gaussian(self, shape: torch.Size | tuple[int, ...], sigma: float) -> Tensor:
        """int64 samples of the discrete Gaussian N_Z(0, sigma'^2), sigma' = sigma rounded up to 1e-6: exact."""
        if not sigma > 0 or not math.isfinite(sigma):
            raise PrivacyParameterError(f"the discrete Gaussian needs a positive finite sigma, got {sigma}")
        numerator = math.ceil(sigma * SIGMA_RESOLUTION) ** 2  # sigma'^2 = numerator / denominator
        denominator = SIGMA_RESOLUTION**2
        values = [self._discrete_gaussian(numerator, denominator) for _ in range(math.prod(shape))]
        return torch.tensor(values, dtype=torch.int64).reshape(shape)

    def discrete_laplace(self, shape: torch.Size | tuple[int, ...], scale: int) -> Tensor:
        """int64 samples of the discrete Laplace, P(x) proportional to exp(-|x| / scale), for an integer scale:
        exact."""
        if not isinstance(scale, int) or scale < 1:
            raise PrivacyParameterError(f"the discrete Laplace needs a positive integer scale, got {scale}")
        values = [self._discrete_laplace(scale) for _ in range(math.prod(shape))]
        return torch.tensor(values, dtype=torch.int64).reshape(shape)

    # --- exact samplers in integer arithmetic (Canonne, Kamath, Steinke 2020) ---------------------------------

    def _bernoulli(self, numerator: int, denominator: int) -> bool:
        """True with probability numerator / denominator (in [0, 1])."""
        return self.randbelow(denominator) < numerator

    def _bernoulli_exp_at_most_one(self, numerator: int, denominator: int) -> bool:
        """True with probability exp(-x), x = numerator / denominator in [0, 1] (their Algorithm 1, first part)."""
        k = 1
        while self._bernoulli(numerator, denominator * k):
            k += 1
        return k % 2 == 1

    def _bernoulli_exp(self, numerator: int, denominator: int) -> bool:
        """True with probability exp(-x) for any rational x = numerator / denominator >= 0."""
        while numerator > denominator:
            if not self._bernoulli_exp_at_most_one(1, 1):
                return False
            numerator -= denominator
        return self._bernoulli_exp_at_most_one(numerator, denominator)

    def _geometric_exp(self, scale: int) -> int:
        """Geometric with failure probability exp(-1 / scale), for an integer scale (their Algorithm 2)."""
        while True:
            remainder = self.randbelow(scale)
            if self._bernoulli_exp(remainder, scale):
                break
        whole = 0
        while self._bernoulli_exp(1, 1):
            whole += 1
        return whole * scale + remainder

    def _discrete_laplace(self, scale: int) -> int:
        """P(x) proportional to exp(-|x| / scale) on the integers."""
        while True:
            negative = self._bernoulli(1, 2)
            magnitude = self._geometric_exp(scale)
            if not (negative and magnitude == 0):
                return -magnitude if negative else magnitude

    def _discrete_gaussian(self, numerator: int, denominator: int) -> int:
        """N_Z(0, s) with s = numerator / denominator: discrete Laplace proposals, accepted with probability
        exp(-(|y| - s / t)^2 / (2 s)), t = floor(sqrt(s)) + 1 (their Algorithm 3)."""
        scale = math.isqrt(numerator // denominator) + 1
        while True:
            candidate = self._discrete_laplace(scale)
            # (|y| - s/t)^2 / (2 s) = (|y| t d - n)^2 / (2 n t^2 d), all integers
            gap = abs(candidate) * scale * denominator - numerator
            if self._bernoulli_exp(gap * gap, 2 * numerator * scale * scale * denominator):
                return candidate

    # --- state: only a reproducible source has any ------------------------------------------------------------

    def state(self) -> dict[str, Any] | None:
        """What a resumed run needs to continue the same stream (None: a secure source keeps nothing)."""
        return None

    def restore(self, state: dict[str, Any] | None) -> None:
        """Continue the stream saved by `state` (a secure source has nothing to restore)."""


class SecureNoise(NoiseSource):
    """The operating system's cryptographically secure generator: nothing to seed, store or replay."""

    reproducible = False
    description = SECURE_DESCRIPTION

    def __init__(self) -> None:
        self._forget_pool()
        _SECURE_SOURCES.add(self)

    def _forget_pool(self) -> None:
        """Drop the bytes read ahead: a forked process must not draw what its parent draws next."""
        self._pool, self._used = b"", 0  # secret bytes read ahead for the exact samplers, each used once

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a copy (pickled or deep-copied) reads its own bytes, never this source's next ones

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()

    def bits(self, count: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * count), dtype=np.uint64).copy()

    def randbelow(self, bound: int) -> int:
        """Uniform in [0, bound) by rejection on bound.bit_length() random bits (as `secrets.randbelow`), the bytes
        read from os.urandom POOL_BYTES at a time: the exact samplers take millions of small integers, and a system
        call for each cost more than the sampling."""
        width = bound.bit_length()
        size = (width + 7) // 8
        while True:
            if self._used + size > len(self._pool):
                self._pool, self._used = os.urandom(max(POOL_BYTES, size)), 0
            value = int.from_bytes(self._pool[self._used:self._used + size], "big") >> (8 * size - width)
            self._used += size
            if value < bound:
                return value


_SECURE_SOURCES: weakref.WeakSet[SecureNoise] = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [source._forget_pool() for source in list(_SECURE_SOURCES)])


class ReproducibleNoise(NoiseSource):
    """Debugging only: the same draws from the same seed, so the noise can be regenerated and subtracted."""

    reproducible = True
    description = REPRODUCIBLE_DESCRIPTION

    def __init__(self, seed: int, stream: int = 0) -> None:
        """`stream` > 0: another stream from the same seed (each process of a run draws its own; stream 0 is the
        single process's)."""
        spawned = (stream,) if stream else ()  # stream 0: PCG64(seed)'s own sequence
        self._words = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=spawned)))
        self._integers = random.Random(f"{seed}/{stream}" if stream else seed)

    def bits(self, count: int) -> np.ndarray:
        return self._words.integers(0, 2**64, size=count, dtype=np.uint64, endpoint=False)

    def randbelow(self, bound: int) -> int:
        return self._integers.randrange(bound)

    def state(self) -> dict[str, Any]:
        version, internal, gauss = self._integers.getstate()
        return {"words": self._words.bit_generator.state,
                "integers": {"version": version, "internal": list(internal), "gauss": gauss}}

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            raise PrivacyParameterError("the interrupted run drew secure noise; it cannot continue as reproducible")
        self._words.bit_generator.state = state["words"]
        integers = state["integers"]
        self._integers.setstate((integers["version"], tuple(integers["internal"]), integers["gauss"]))


def noise_source(reproducible: bool = False, seed: int = 0, stream: int = 0) -> NoiseSource:
    """The secure source, or (debugging only) one reproducible from `seed` (its `stream`: one per process of a
    run, so that no two processes draw the same)."""
    return ReproducibleNoise(seed, stream) if reproducible else SecureNoise()
