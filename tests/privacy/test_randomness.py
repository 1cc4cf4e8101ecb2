"""Noise sources: secret by default, distributed as documented, reproducible only when asked."""

import json
import math

import numpy as np
import pytest
import scipy.stats
import torch

from dpdistill.errors import PrivacyParameterError
from dpdistill.privacy.randomness import ReproducibleNoise, SecureNoise, noise_source

# Statistical tests reject at p < 1e-6: a correct sampler fails one in a million runs.
REJECT = 1e-6


def test_secure_draws_never_repeat_across_sources_or_calls():
    first, second = SecureNoise(), SecureNoise()
    draws = [first.normal((64,), 1.0), first.normal((64,), 1.0), second.normal((64,), 1.0)]
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert first.state() is None  # nothing to store, so nothing to replay


def test_reproducible_noise_repeats_from_its_seed_and_resumes_from_its_state():
    assert torch.equal(ReproducibleNoise(7).normal((32,), 1.0), ReproducibleNoise(7).normal((32,), 1.0))
    assert not torch.equal(ReproducibleNoise(7).normal((32,), 1.0), ReproducibleNoise(8).normal((32,), 1.0))
    source = ReproducibleNoise(7)
    source.discrete_gaussian((3,), 2.0)
    saved = json.loads(json.dumps(source.state()))  # it travels through a JSON checkpoint
    expected = (source.normal((5,), 1.0), source.discrete_gaussian((5,), 3.0))
    source.restore(saved)
    assert torch.equal(source.normal((5,), 1.0), expected[0])
    assert torch.equal(source.discrete_gaussian((5,), 3.0), expected[1])


def test_each_process_of_a_reproducible_run_draws_its_own_stream():
    """Stream 0 is the single process's (runs repeat as before); the others' words and small integers differ."""
    assert np.array_equal(ReproducibleNoise(7, 0).bits(8), np.random.Generator(np.random.PCG64(7)).integers(
        0, 2**64, size=8, dtype=np.uint64, endpoint=False))
    streams = [noise_source(True, 7, stream) for stream in range(3)]
    words = [tuple(source.bits(8)) for source in streams]
    integers = [tuple(source.randbelow(2**40) for _ in range(4)) for source in streams]
    assert len(set(words)) == len(set(integers)) == 3
    assert tuple(noise_source(True, 7, 2).bits(8)) == words[2]  # and each repeats


def test_a_secure_run_cannot_continue_as_a_reproducible_one():
    with pytest.raises(PrivacyParameterError, match="secure noise"):
        ReproducibleNoise(0).restore(None)


def test_noise_source_is_secure_unless_asked():
    assert isinstance(noise_source(), SecureNoise) and not noise_source().reproducible
    assert noise_source(reproducible=True, seed=3).reproducible


def test_uniforms_stay_inside_the_open_interval_and_are_uniform():
    values = SecureNoise().uniform((200_000,))
    assert values.dtype == torch.float64 and 0 < values.min() and values.max() < 1
    assert scipy.stats.kstest(values.numpy(), "uniform").pvalue > REJECT


@pytest.mark.parametrize("std", [0.5, 40.0])
def test_gaussian_noise_has_the_stated_scale_and_shape(std):
    noise = SecureNoise().normal((400, 500), std)
    assert noise.shape == (400, 500) and noise.dtype == torch.float32
    assert scipy.stats.kstest(noise.flatten().double().numpy() / std, "norm").pvalue > REJECT
    assert abs(noise.std().item() / std - 1) < 0.01  # standard error of a 200,000-sample std: 0.16%


@pytest.mark.parametrize("sigma", [0.8, 3.0, 25.0])
def test_discrete_gaussian_matches_its_exact_probabilities(sigma):
    samples = SecureNoise().discrete_gaussian((20_000,), sigma).numpy()
    support = np.arange(-int(8 * sigma) - 2, int(8 * sigma) + 3)
    pmf = np.exp(-support.astype(float) ** 2 / (2 * sigma**2))
    assert samples.min() >= support[0] and samples.max() <= support[-1]
    assert chi_square_pvalue(samples, support, pmf / pmf.sum()) > REJECT


def chi_square_pvalue(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square of integer `samples` against `pmf` on `support`, over bins with enough expected counts (the
    tails pooled into one bin)."""
    expected = pmf * len(samples)
    observed = np.array([(samples == value).sum() for value in support], dtype=float)
    keep = expected >= 5
    pooled_expected = np.append(expected[keep], expected[~keep].sum())
    pooled_observed = np.append(observed[keep], observed[~keep].sum())
    if pooled_expected[-1] < 5:
        pooled_expected, pooled_observed = pooled_expected[:-1], pooled_observed[:-1]
    pooled_expected *= pooled_observed.sum() / pooled_expected.sum()
    return scipy.stats.chisquare(pooled_observed, pooled_expected).pvalue


def test_discrete_gaussian_refuses_a_bad_sigma():
    for sigma in (0.0, -1.0, math.inf):
        with pytest.raises(PrivacyParameterError):
            SecureNoise().discrete_gaussian((2,), sigma)


def test_categorical_follows_its_weights_and_never_picks_a_zero_weight():
    weights = torch.tensor([[1.0, 2.0, 0.0, 1.0]]).repeat(40_000, 1)
    counts = torch.bincount(SecureNoise().categorical(weights), minlength=4).numpy()
    assert counts[2] == 0
    assert scipy.stats.chisquare(counts[[0, 1, 3]], np.array([0.25, 0.5, 0.25]) * 40_000).pvalue > REJECT


def test_bernoulli_rate():
    hits = SecureNoise().bernoulli((100_000,), 0.03).sum().item()
    assert scipy.stats.binomtest(hits, 100_000, 0.03).pvalue > REJECT


@pytest.mark.parametrize("scale", [1, 4, 40])
def test_discrete_laplace_matches_its_exact_probabilities(scale):
    samples = SecureNoise().discrete_laplace((20_000,), scale).numpy()
    p = math.exp(-1 / scale)
    support = np.arange(-20 * scale - 2, 20 * scale + 3)  # beyond: mass below e^-20 per sample
    pmf = (1 - p) / (1 + p) * p ** np.abs(support)
    assert samples.min() >= support[0] and samples.max() <= support[-1]
    assert chi_square_pvalue(samples, support, pmf) > REJECT
    with pytest.raises(PrivacyParameterError):
        SecureNoise().discrete_laplace((3,), 2.5)


def test_secure_small_integers_are_uniform_and_read_the_system_in_blocks(monkeypatch):
    import os

    reads = []
    system = os.urandom
    monkeypatch.setattr(os, "urandom", lambda size: reads.append(size) or system(size))
    noise = SecureNoise()
    draws = np.array([noise.randbelow(6) for _ in range(60_000)])
    assert len(reads) <= 2  # 60,000 draws of one byte each (rejection: 3 bits of 8 kept, 3/4 accepted)
    counts = np.bincount(draws, minlength=6)
    assert len(counts) == 6 and scipy.stats.chisquare(counts).pvalue > REJECT
    wide = [noise.randbelow(10**30) for _ in range(2_000)]  # several bytes a draw, never at or above the bound
    assert max(wide) < 10**30 and len(set(wide)) == 2_000


def test_a_copied_secure_source_does_not_draw_the_originals_next_integers():
    import copy
    import pickle

    noise = SecureNoise()
    noise.randbelow(2)  # it has read ahead
    copies = [copy.deepcopy(noise), pickle.loads(pickle.dumps(noise))]
    drawn = [[source.randbelow(2**32) for _ in range(8)] for source in copies]
    assert [noise.randbelow(2**32) for _ in range(8)] not in drawn and drawn[0] != drawn[1]


def test_a_forked_process_does_not_draw_its_parents_next_secure_integers():
    import os

    noise = SecureNoise()
    noise.randbelow(2)  # the parent has read ahead
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        os.write(writer, json.dumps([noise.randbelow(2**32) for _ in range(8)]).encode())
        os._exit(0)
    os.waitpid(child, 0)
    os.close(writer)
    assert json.loads(os.read(reader, 4096)) != [noise.randbelow(2**32) for _ in range(8)]
