"""The ledger of the individuals in the data: every release computed from private data is recorded for the examples
it read, and a total set on a data set bounds its worst-off example, whatever file, order, subset or merge a later
release reads them from; it refuses a release that would pass it before any work, and no report names a digest."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting import NoOpDpEvent
from typer.testing import CliRunner

from dpdistill.cli.main import app
from dpdistill.data import load_dataset
from dpdistill.paths import ledgers_home
from dpdistill.errors import BudgetExceededError
from dpdistill.methods.config import build_config
from dpdistill.pipeline import synthesize, train_private, transcribe
from dpdistill.privacy.individuals import DatasetLedger
from dpdistill.privacy.ledger import LEDGER_FILE, LedgerEntry, Release
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
    [recorded] = DatasetLedger(load_dataset("digits").digest, "digits").read().entries
    assert recorded.entry.status == "spent" and recorded.entry.out_dir == str((tmp_path / "first").resolve())


def test_every_release_from_a_data_set_composes_in_its_ledger(ledgers: Path, tmp_path: Path, digits_teacher: Path):
    dpsgd = train_private(_dpsgd(1.0, "add-remove"), tmp_path / "dpsgd")
    merf = synthesize(MeanEmbeddingConfig(dataset="digits", epsilon=0.5, steps=2, synthetic_size=20, student_epochs=1),
                      tmp_path / "merf")
    route = transcribe(digits_teacher, build_config("demo", {"iterations": 1, "batch_size": 8},
                                                     {"mode": "data", "epsilon": 2.0}), tmp_path / "route")
    entries = [recorded.entry for recorded in DatasetLedger(load_dataset("digits").digest, "digits").read().entries]
    assert [entry.method for entry in entries] == ["dpsgd", "dp-merf", "dpsd"]
    stated = [dpsgd["privacy"]["epsilon_replace_one"], merf["privacy"]["epsilon"], route["privacy"]["epsilon"]]
    assert [entry.release.epsilon for entry in entries] == pytest.approx(stated)
    assert route["privacy"]["data_set_ledger"]["spent_epsilon"] == pytest.approx(sum(stated))
    for report in (dpsgd, merf, route):  # the ledger's key is a digest of the private data: never in a report
        assert load_dataset("digits").digest not in json.dumps(report)


def _arrays(rng: np.random.Generator, train: int) -> dict[str, np.ndarray]:
    return {"x_train": rng.integers(0, 256, (train, 8, 8), dtype=np.uint8), "y_train": np.arange(train) % 4,
            "x_test": rng.integers(0, 256, (10, 8, 8), dtype=np.uint8), "y_test": np.arange(10) % 4}


def _ledger(path: Path) -> DatasetLedger:
    """The ledger as a run on the .npz at `path` sees it (its examples kept, as `data_read` keeps them)."""
    data = load_dataset(str(path))
    return DatasetLedger.of(data.digest, path.stem, lambda: data.example_ids.numpy())


def test_a_total_on_a_data_set_bounds_its_examples_in_any_copy_order_subset_or_merge(ledgers: Path,
                                                                                        tmp_path: Path):
    rng = np.random.default_rng(0)
    original, other = _arrays(rng, 40), _arrays(rng, 30)
    order = rng.permutation(40)
    files = {"original": original,
             "reordered": {**original, "x_train": original["x_train"][order], "y_train": original["y_train"][order]},
             "subset": {**original, "x_train": original["x_train"][5:20], "y_train": original["y_train"][5:20]},
             "merged": {**original, "x_train": np.concatenate([other["x_train"], original["x_train"][:3]]),
                        "y_train": np.concatenate([other["y_train"], original["y_train"][:3]])},
             "unrelated": other}
    for name, arrays in files.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
    ledgers_of = {name: _ledger(tmp_path / f"{name}.npz") for name in files}
    assert len({ledger.digest for ledger in ledgers_of.values()}) == 5  # five files, five digests
    ledgers_of["original"].set_total(2.0, 1e-4)
    ledgers_of["original"].reserve(tmp_path / "first", "dpsgd", Release(NoOpDpEvent(), 1e-5, 1.5))
    for name in ("reordered", "subset", "merged"):  # the same individuals: 1.5 + 1.0 passes 2 for them
        with pytest.raises(BudgetExceededError, match=f"examples of the data set {name} past the privacy budget set "
                                                      f"on original"):
            ledgers_of[name].reserve(tmp_path / name, "dpsgd", Release(NoOpDpEvent(), 1e-5, 1.0))
        ledgers_of[name].reserve(tmp_path / name, "dpsgd", Release(NoOpDpEvent(), 1e-5, 0.4))  # 1.9: within
        ledgers_of[name].withdraw(tmp_path / name)
    ledgers_of["unrelated"].reserve(tmp_path / "unrelated", "dpsgd", Release(NoOpDpEvent(), 1e-5, 5.0))  # no total
    # the merge's worst-off example: one of the unrelated data's (5); under the original's total, 1.5 of 2
    shown = ledgers_of["merged"].standing(ledgers_of["merged"].read())
    assert (shown["spent_epsilon"], shown["total_epsilon"], shown["total_on"]) == (5.0, 2.0, "original")
    assert (shown["spent_under_total"], shown["remaining"]) == (pytest.approx(1.5), pytest.approx(0.5))
    # a changed copy of an image is another example: the ledger cannot see it
    changed = {**original, "x_train": np.clip(original["x_train"].astype(int) + 1, 0, 255).astype(np.uint8)}
    np.savez(tmp_path / "changed.npz", **changed)
    _ledger(tmp_path / "changed.npz").reserve(tmp_path / "changed", "dpsgd", Release(NoOpDpEvent(), 1e-5, 1.0))


def test_the_ledger_knows_a_data_set_by_its_content(tmp_path: Path):
    arrays = _arrays(np.random.default_rng(0), 40)
    for name in ("mine.npz", "a-copy-of-mine.npz"):
        np.savez(tmp_path / name, **arrays)
    mine = load_dataset(str(tmp_path / "mine.npz"))
    assert load_dataset(str(tmp_path / "a-copy-of-mine.npz")).digest == mine.digest  # another name, same data
    assert mine.train_subset(slice(1, None)).digest != mine.digest  # one example fewer: another data set
    # its examples' content ids do not depend on the ids the data give (a built-in set's are file positions)
    assert not torch.equal(load_dataset("digits").example_ids, load_dataset("digits").ids_train)


def test_a_ledger_of_the_earlier_layout_is_read_in_once(ledgers: Path):
    digest = "e" * 32
    (ledgers / digest).mkdir(parents=True)
    entry = LedgerEntry("/runs/old", "dpsgd", "2026-11-01T00:00:00+00:00", "spent", Release(NoOpDpEvent(), 1e-5, 0.8))
    (ledgers / digest / LEDGER_FILE).write_text(json.dumps(
        {"format": 1, "total": {"epsilon": 1.0, "delta": 1e-5}, "entries": [entry.to_json()]}))
    ledger = DatasetLedger(digest, "old data")
    shown = ledger.standing(ledger.read())
    assert (shown["spent_epsilon"], shown["total_epsilon"]) == (pytest.approx(0.8), 1.0)
    assert not (ledgers / digest / LEDGER_FILE).exists() and (ledgers / digest / "ledger.json.migrated").exists()
    with pytest.raises(BudgetExceededError):
        ledger.reserve(Path("/runs/new"), "dpsgd", Release(NoOpDpEvent(), 1e-5, 0.3))
    assert len(DatasetLedger(digest).read().entries) == 1  # read in once


def test_a_total_set_without_a_delta_takes_the_delta_the_spent_epsilon_is_shown_at(ledgers: Path):
    ledger = DatasetLedger("f" * 32, "mine")
    for run in ("a", "b", "c"):  # three releases at delta 1e-5 each: together (sum of epsilons, 3e-5)
        ledger.reserve(Path(run), "dpsgd", Release(NoOpDpEvent(), 1e-5, 4.5))
    shown = ledger.standing(ledger.read())
    assert (shown["spent_epsilon"], shown["delta"]) == (pytest.approx(13.5), pytest.approx(3e-5))
    with pytest.raises(BudgetExceededError, match=r"add up to 3e-05: give --delta 3e-05 or more"):
        ledger.set_total(14.0, 1e-5)
    [total] = ledger.set_total(14.0).totals  # as the display said: 13.5 at delta 3e-5
    assert (total.budget.epsilon, total.budget.delta) == (14.0, pytest.approx(3e-5))
