"""One ledger per data set: every release computed from it composes there, under replace-one, and a total set on
it refuses a release that would exceed it before any work; it knows the data by content, and no report names it."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import NoOpDpEvent
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.paths import ledgers_home
from dpdistill.errors import BudgetExceededError
from dpdistill.methods.config import build_config
from dpdistill.pipeline import synthesize, train_private, transcribe
from dpdistill.privacy.ledger import DatasetLedger, Release, summed_epsilon
from dpdistill.training.mean_embedding import MeanEmbeddingConfig
from dpdistill.training.private import PrivateTrainingConfig


@pytest.fixture
def ledgers(tmp_path: Path, monkeypatch) -> Path:
    """This test's own data-set ledgers."""
    monkeypatch.setenv("DPDISTILL_LEDGER_HOME", str(tmp_path / "ledgers"))
    return tmp_path / "ledgers"


def _dpsgd(epsilon: float, relation: str = "replace-one") -> PrivateTrainingConfig:
    return PrivateTrainingConfig(dataset="digits", epsilon=epsilon, relation=relation, student_arch="scatter-linear",
                                 epochs=2, batch_size=256, lr=2.0)


def test_a_data_sets_total_refuses_the_release_that_would_exceed_it_before_it_trains(ledgers: Path, tmp_path: Path):
    result = CliRunner().invoke(app, ["budget", "--dataset", "digits", "--set", "2", "--delta", "3e-5"])
    assert result.exit_code == 0, result.output
    first = train_private(_dpsgd(1.5), tmp_path / "first")
    assert first["privacy"]["data_set_ledger"]["spent_epsilon"] == pytest.approx(first["privacy"]["epsilon"])
    with pytest.raises(BudgetExceededError, match="past its privacy budget"):
        train_private(_dpsgd(1.5), tmp_path / "second")
    assert not (tmp_path / "second").exists()
    # add/remove enters with its replace-one epsilon: 0.3 under add/remove is above the 0.5 that remains
    with pytest.raises(BudgetExceededError, match="data set digits"):
        train_private(_dpsgd(0.3, "add-remove"), tmp_path / "third")
    [entry] = DatasetLedger(load_dataset("digits").digest, "digits").read().entries
    assert entry.status == "spent" and entry.out_dir == str((tmp_path / "first").resolve())


def test_every_release_from_a_data_set_composes_in_its_ledger(ledgers: Path, tmp_path: Path, digits_teacher: Path):
    dpsgd = train_private(_dpsgd(1.0, "add-remove"), tmp_path / "dpsgd")
    merf = synthesize(MeanEmbeddingConfig(dataset="digits", epsilon=0.5, steps=2, synthetic_size=20, student_epochs=1),
                      tmp_path / "merf")
    route = transcribe(digits_teacher, build_config("demo", {"iterations": 1, "batch_size": 8},
                                                     {"mode": "data", "epsilon": 2.0}), tmp_path / "route")
    entries = DatasetLedger(load_dataset("digits").digest, "digits").read().entries
    assert [entry.method for entry in entries] == ["dpsgd", "dp-merf", "dpsd"]
    stated = [dpsgd["privacy"]["epsilon_replace_one"], merf["privacy"]["epsilon"], route["privacy"]["epsilon"]]
    assert [entry.release.epsilon for entry in entries] == pytest.approx(stated)
    assert route["privacy"]["data_set_ledger"]["spent_epsilon"] == pytest.approx(sum(stated))
    for report in (dpsgd, merf, route):  # the ledger's key is a digest of the private data: never in a report
        assert load_dataset("digits").digest not in json.dumps(report)


def test_the_ledger_knows_a_data_set_by_its_content(tmp_path: Path):
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), "y_train": np.arange(40) % 4,
              "x_test": rng.integers(0, 256, (10, 8, 8), dtype=np.uint8), "y_test": np.arange(10) % 4}
    for name in ("mine.npz", "a-copy-of-mine.npz"):
        np.savez(tmp_path / name, **arrays)
    mine = load_dataset(str(tmp_path / "mine.npz"))
    assert load_dataset(str(tmp_path / "a-copy-of-mine.npz")).digest == mine.digest  # another name, same data
    assert mine.train_subset(slice(1, None)).digest != mine.digest  # one example fewer: another data set


def test_summed_composition_adds_epsilons_and_deltas():
    release = Release(None, 1e-5, 0.7)
    assert summed_epsilon([release, release], 2e-5) == pytest.approx(1.4)
    assert summed_epsilon([release, release], 1e-5) == float("inf")  # the deltas add up past it
    assert summed_epsilon([], 1e-5) == 0


def test_a_total_set_without_a_delta_takes_the_delta_the_spent_epsilon_is_shown_at(ledgers: Path):
    ledger = DatasetLedger("f" * 32, "mine")
    for run in ("a", "b", "c"):  # three releases at delta 1e-5 each: together (sum of epsilons, 3e-5)
        ledger.reserve(Path(run), "dpsgd", Release(NoOpDpEvent(), 1e-5, 4.5))
    shown = ledger.standing(ledger.read())
    assert (shown["spent_epsilon"], shown["delta"]) == (pytest.approx(13.5), pytest.approx(3e-5))
    with pytest.raises(BudgetExceededError, match=r"add up to 3e-05: give --delta 3e-05 or more"):
        ledger.set_total(14.0, 1e-5)
    state = ledger.set_total(14.0)  # as the display said: 13.5 at delta 3e-5
    assert (state.total.epsilon, state.total.delta) == (14.0, pytest.approx(3e-5))
