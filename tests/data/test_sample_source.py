"""A sample source is read whole and checked before any work: every bad input is one clear error; a good one gives
its images, labels and release, and the route's noise is calibrated so that both releases compose to the budget."""

import json
import math
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from dpdistill.data import load_dataset
from dpdistill.data.sample_source import SAMPLES_FILE, SOURCE_REPORT, load_sample_source
from dpdistill.errors import ConfigError
from dpdistill.privacy.budget import PrivacyRequest, plan_privacy
from dpdistill.privacy.ledger import Release, composed_epsilon
from helpers import gdp_epsilon, write_sample_source

SHAPE, CLASSES = (1, 8, 8), 10


def _digits(count: int = 50) -> tuple[np.ndarray, np.ndarray]:
    digits = load_dataset("digits")
    return digits.x_train[:count].numpy(), digits.y_train[:count].numpy()


def _pickled(directory: Path) -> None:
    x, y = _digits()
    np.savez(directory / SAMPLES_FILE, x=np.array(list(x), dtype=object), y=y)


def _without(name: str) -> Callable[[Path], None]:
    return lambda directory: (directory / name).unlink()


def _rewritten(array: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    def rewrite(directory: Path) -> None:
        with np.load(directory / SAMPLES_FILE) as arrays:
            values = dict(arrays)
        values[array] = change(values[array])
        np.savez(directory / SAMPLES_FILE, **values)
    return rewrite


def _privacy(**changes) -> Callable[[Path], None]:
    def rewrite(directory: Path) -> None:
        report = json.loads((directory / SOURCE_REPORT).read_text())
        report["privacy"] = {key: value for key, value in {**report["privacy"], **changes}.items() if value is not None}
        (directory / SOURCE_REPORT).write_text(json.dumps(report))
    return rewrite


@pytest.mark.parametrize("damage, message", [
    (lambda directory: [path.unlink() for path in directory.iterdir()] and directory.rmdir(), "is not a directory"),
    (_without(SAMPLES_FILE), "has no"),
    (_without(SOURCE_REPORT), "its release cannot be composed without it"),
    (_pickled, "cannot be read without unpickling"),
    (lambda directory: (directory / SAMPLES_FILE).write_bytes(b"not a zip"), "cannot be read without unpickling"),
    (_rewritten("x", lambda x: x[:, :, :7, :7]), "the teacher takes float images (n, 1, 8, 8)"),
    (_rewritten("x", lambda x: np.rint(x).astype(np.int64)), "the teacher takes float images"),
    (_rewritten("x", lambda x: x * 255), "images must lie in [-1, 1]"),
    (_rewritten("x", lambda x: np.where(x > 0.99, np.nan, x)), "non-finite"),
    (_rewritten("y", lambda y: y + 1), "classes 0..9"),
    (_rewritten("y", lambda y: y[:-1]), "expected integer labels (50,)"),
    (_rewritten("y", lambda y: y.astype(np.float32)), "expected integer labels"),
    (_privacy(event=None), "has no privacy 'event'"),
    (_privacy(event={"type": "LaplaceDpEvent", "parameter": 1}), "states its privacy wrongly"),
    (_privacy(epsilon=math.inf), "a formal guarantee needs a finite positive epsilon"),
])
def test_a_bad_source_is_one_clear_error(tmp_path: Path, damage, message):
    directory = write_sample_source(tmp_path / "source", *_digits())
    damage(directory)
    with pytest.raises(ConfigError) as error:
        load_sample_source(directory, SHAPE, CLASSES)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_good_source_gives_its_images_labels_and_release(tmp_path: Path):
    x, y = _digits()
    source = load_sample_source(write_sample_source(tmp_path, x, y, noise_multiplier=8.0, delta=1e-6), SHAPE, CLASSES)
    assert source.images.dtype.is_floating_point and source.images.shape == (50, *SHAPE)
    assert np.array_equal(source.images.numpy(), x) and np.array_equal(source.labels.numpy(), y)
    assert source.release.epsilon == pytest.approx(gdp_epsilon(1 / 8.0, 1e-6)) and source.release.delta == 1e-6
    assert source.formal_guarantee and source.uncovered == []
    assert source.summary()["method"] == "datalens" and "50 synthetic images" in source.description


def test_a_source_without_a_formal_guarantee_is_an_uncovered_read_and_composes_nothing(tmp_path: Path):
    directory = write_sample_source(tmp_path, *_digits(), formal_guarantee=False, event=None)
    source = load_sample_source(directory, SHAPE, CLASSES)
    assert not source.formal_guarantee and source.cost(1.0, 1e-5) is None
    (read,) = source.uncovered
    assert read.covered.startswith("NO formal guarantee")


@pytest.mark.parametrize("epsilon, delta, message", [(0.5, 1e-5, "leaves nothing of --epsilon 0.5"),
                                                     (10.0, 1e-7, "above this run's delta")])
def test_a_source_that_leaves_no_budget_is_refused(tmp_path: Path, epsilon, delta, message):
    source = load_sample_source(write_sample_source(tmp_path, *_digits(), noise_multiplier=2.0), SHAPE, CLASSES)
    assert source.release.epsilon > 0.5
    with pytest.raises(ConfigError, match=message):
        source.cost(epsilon, delta)


def test_gaussian_answers_are_calibrated_so_that_their_mu_squared_and_the_sources_fill_the_budget(tmp_path: Path):
    epsilon, delta, batch, iterations = 2.0, 1e-5, 32, 5
    source = load_sample_source(write_sample_source(tmp_path, *_digits(), noise_multiplier=3.0), SHAPE, CLASSES)
    request = PrivacyRequest(mode="data", epsilon=epsilon, delta=delta)
    alone = plan_privacy(request, CLASSES, batch, iterations)
    with_source = plan_privacy(request, CLASSES, batch, iterations, source.cost(epsilon, delta))
    assert with_source.sigma > alone.sigma * 1.05  # the source took part of the budget
    route = Release.of_plan(with_source, batch * iterations)
    total = source.composed(route).epsilon
    assert total == composed_epsilon([source.release, route], delta) <= epsilon
    mu = math.sqrt(3.0 ** -2 + batch * iterations / with_source.query.noise_multiplier ** 2)  # Gaussians: mu^2 adds
    assert gdp_epsilon(mu, delta) == pytest.approx(total, rel=1e-6)
    assert total == pytest.approx(epsilon, rel=1e-3)  # and nothing of it is left unused
    assert route.epsilon < total


def test_randomized_response_is_calibrated_against_the_composition_too(tmp_path: Path):
    epsilon, delta = 4.0, 1e-5
    source = load_sample_source(write_sample_source(tmp_path, *_digits(), noise_multiplier=3.0), SHAPE, CLASSES)
    request = PrivacyRequest(mode="label", epsilon=epsilon, delta=delta, num_candidates=3)
    alone = plan_privacy(request, CLASSES, 16, 4)
    with_source = plan_privacy(request, CLASSES, 16, 4, source.cost(epsilon, delta))
    assert with_source.epsilon0 < alone.epsilon0
    route = Release.of_plan(with_source, 64)
    assert composed_epsilon([source.release, route], delta) <= epsilon
