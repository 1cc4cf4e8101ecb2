"""The ledger of the individuals in the data: every release computed from private data, keyed by the examples it
read, so that releases compose for every example they share.

Differential privacy protects each example. Two releases compose for every example they both read, whatever the
files were called, however they were ordered, and whether one data set is a subset, a superset or a merge of
another. So each release is recorded with the examples it read, named by content (data/base.py `content_ids`: a
digest of each example's image and label, and which copy of that pair it is), and a total set on a data set
bounds its worst-off example: for each example, the epsilons and the deltas of every release that read it, added
(basic composition, under replace-one: releases of every kind and both relations meet here, each entering with
its replace-one figure). What it cannot see: a changed copy of an image (resized, re-encoded, one pixel moved) is
another example to it, as a new person would be.

Files, under $DPDISTILL_LEDGER_HOME (owner-only: content ids are digests of private examples, and never leave it):
- `examples/<digest>.npy`: the sorted content ids of one data set's training split, named by the data's digest
  (ImageDataset.digest); written once, the first time a release reads those data.
- `ledger.json`: every release (its run, method, status, dp-accounting event, epsilon and delta, and the digest
  of the examples it read) and every total (epsilon and delta, on the examples of one data set).
A release whose examples were never written (a teacher trained before they were kept) is known by its data's
digest alone: it composes with the releases of exactly those data. Ledgers of the earlier layout (one folder
per digest) are read into this one the first time it is opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from dpdistill.errors import BudgetExceededError, CheckpointError, PrivacyParameterError
from dpdistill.paths import ledgers_home
from dpdistill.privacy.ledger import (DEFAULT_DELTA, LEDGER_FILE, LOCK_FILE, RESERVED, SPENT, Budget, LedgerEntry,
                                      Release)
from dpdistill.reporting.report import write_json

FORMAT = 2
EXAMPLES_DIR = "examples"
MIGRATED = ".migrated"  # suffix an earlier layout's ledger.json takes once read into this one


@dataclass(frozen=True)
class Total:
    """A data owner's total, on the examples of one data set: no example of them may pass it."""

    examples: str  # the data's digest
    name: str
    budget: Budget


@dataclass(frozen=True)
class Recorded:
    """One release and the examples it read."""

    entry: LedgerEntry
    examples: str  # the digest of the data set whose training examples it read
    name: str

    @property
    def release(self) -> Release:
        return self.entry.release


@dataclass(frozen=True)
class IndividualsState:
    """The contents of ledger.json."""

    entries: tuple[Recorded, ...] = ()
    totals: tuple[Total, ...] = ()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class DatasetLedger:
    """The individuals' ledger as seen from one data set (its digest and the name a user gave it): what the
    releases that read any of its examples spent on its worst-off example, and the totals that bound them."""

    def __init__(self, digest: str, name: str | None = None) -> None:
        self.digest, self.name = digest, name or digest[:8]
        self.home = ledgers_home()
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.home / LEDGER_FILE

    @classmethod
    def of(cls, digest: str, name: str, content_ids: Callable[[], np.ndarray]) -> "DatasetLedger":
        """The ledger of a data set whose examples' content ids `content_ids()` gives: they are kept, the first
        time (computed then only), so that every release of them composes with every release of any other data
        holding some of them."""
        ledger = cls(digest, name)
        path = ledger._examples_path(digest)
        if not path.exists():
            path.parent.mkdir(exist_ok=True, mode=0o700)
            partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
            with open(partial, "wb") as handle:
                np.save(handle, np.unique(np.asarray(content_ids(), dtype=np.int64)))
            os.replace(partial, path)
        return ledger

    @property
    def subject(self) -> str:
        return f"the data set {self.name}"

    @property
    def raise_total(self) -> str:
        return f"dpdistill budget --dataset {self.name} --set EPS"

    # --- what each example spent ------------------------------------------------------------------------------

    def _examples_path(self, digest: str) -> Path:
        return self.home / EXAMPLES_DIR / f"{digest}.npy"

    def examples(self, digest: str) -> np.ndarray:
        """The sorted content ids a digest names; where they were never kept, one id standing for the data
        themselves (negative, so that no content id meets it)."""
        return _examples(self._examples_path(digest), digest)

    def worst_off(self, entries: tuple[Recorded, ...], among: np.ndarray) -> tuple[float, float]:
        """The largest sums of epsilons and of deltas over the examples `among` of the releases that read them."""
        if not len(among):
            return 0.0, 0.0
        epsilons, deltas = np.zeros(len(among)), np.zeros(len(among))
        for recorded in entries:
            read = np.isin(among, self.examples(recorded.examples), assume_unique=True)
            epsilons[read] += recorded.release.epsilon
            deltas[read] += recorded.release.delta
        return float(epsilons.max()), float(deltas.max())

    def _bound(self, state: IndividualsState, kept: tuple[Recorded, ...], release: Release | None,
               total: Total) -> tuple[float, float]:
        """The worst-off spending, under `total`, of this data set's examples it covers once `release` (None:
        nothing more) joins the `kept` releases: epsilon (infinite where the deltas pass the total's) and delta."""
        shared = np.intersect1d(self.examples(self.digest), self.examples(total.examples), assume_unique=True)
        epsilon, delta = self.worst_off(kept, shared)
        if release is not None and len(shared):
            epsilon, delta = epsilon + release.epsilon, delta + release.delta
        return (math.inf if delta > total.budget.delta * (1 + 1e-9) else epsilon), delta

    def _overlapping(self, state: IndividualsState) -> list[Total]:
        mine = self.examples(self.digest)
        return [total for total in state.totals
                if np.intersect1d(mine, self.examples(total.examples), assume_unique=True).size]

    def standing(self, state: IndividualsState) -> dict[str, Any]:
        """A report's `data_set_ledger` section (functions of public epsilons only): the worst-off example of this
        data set, the tightest total over it and what remains of it."""
        epsilon, delta = self.worst_off(state.entries, self.examples(self.digest))
        figures = {"data_set": self.name, "total_epsilon": None, "delta": delta or DEFAULT_DELTA,
                   "spent_epsilon": epsilon, "remaining": None}
        for total in self._overlapping(state):  # the total that leaves the least: its own data's, or another's
            spent, _ = self._bound(state, state.entries, None, total)
            remaining = total.budget.epsilon - spent
            if figures["remaining"] is None or remaining < figures["remaining"]:
                figures.update(total_epsilon=total.budget.epsilon, delta=total.budget.delta, remaining=remaining,
                               total_on=total.name, spent_under_total=spent)
        return {**figures, "composition": "per example: the releases that read it, summed (replace-one)"}

    def releases(self, state: IndividualsState) -> list[Recorded]:
        """The releases that read any example of this data set."""
        mine = self.examples(self.digest)
        return [recorded for recorded in state.entries
                if np.intersect1d(mine, self.examples(recorded.examples), assume_unique=True).size]

    # --- changes ----------------------------------------------------------------------------------------------

    def reserve(self, out_dir: Path, method: str, release: Release, resume: bool = False) -> IndividualsState:
        """Record the release the run writing `out_dir` plans, before its first query; refuse it if an example of
        this data set would pass a total. A resumed run keeps its reservation."""
        key = str(out_dir.resolve())
        with self._locked():
            state = self._read()
            if resume and self._reservation(state, key) is not None:
                return state
            self._refuse_past_totals(state, state.entries, release)
            entry = LedgerEntry(key, method, _now(), RESERVED, release)
            state = replace(state, entries=(*state.entries, Recorded(entry, self.digest, self.name)))
            self._write(state)
            return state

    def _refuse_past_totals(self, state: IndividualsState, kept: tuple[Recorded, ...], release: Release) -> None:
        for total in state.totals:
            after, _ = self._bound(state, kept, release, total)
            if after > total.budget.epsilon:
                spent, _ = self._bound(state, kept, None, total)
                whose = (f"{self.subject} past its privacy budget" if total.examples == self.digest else
                         f"examples of {self.subject} past the privacy budget set on {total.name}")
                raise BudgetExceededError(
                    f"this release would take {whose} (epsilon {total.budget.epsilon:g} at delta "
                    f"{total.budget.delta:g}): its worst-off example has spent {spent:.4g}, and this run's "
                    f"epsilon={release.epsilon:.4g} would bring it to {after:.4g}. Lower --epsilon, or let the "
                    f"data owner raise the total with `dpdistill budget --dataset {total.name} --set EPS`")

    def _reservation(self, state: IndividualsState, key: str) -> int | None:
        return next((index for index in reversed(range(len(state.entries)))
                     if state.entries[index].entry.out_dir == key and state.entries[index].examples == self.digest
                     and state.entries[index].entry.status == RESERVED), None)

    def settle(self, out_dir: Path, method: str, release: Release) -> IndividualsState:
        """Mark the reservation of the run writing `out_dir` spent, with the release it actually made."""
        key = str(out_dir.resolve())
        with self._locked():
            state = self._read()
            index = self._reservation(state, key)
            entries = list(state.entries)
            if index is None:  # the ledger was replaced while the run went on: record the release all the same
                entries.append(Recorded(LedgerEntry(key, method, _now(), SPENT, release), self.digest, self.name))
            else:
                entries[index] = replace(entries[index], entry=replace(entries[index].entry, status=SPENT,
                                                                        release=release))
            state = replace(state, entries=tuple(entries))
            self._write(state)
            return state

    def withdraw(self, out_dir: Path) -> IndividualsState:
        """Drop the reservation of the run writing `out_dir`, which failed before it released anything."""
        with self._locked():
            state = self._read()
            index = self._reservation(state, str(out_dir.resolve()))
            if index is None:
                return state
            state = replace(state, entries=state.entries[:index] + state.entries[index + 1:])
            self._write(state)
            return state

    def set_total(self, epsilon: float, delta: float | None = None) -> IndividualsState:
        """Set or change the total on this data set's examples (`delta` None: the delta its worst-off example is
        shown at, as `standing` gives it); refuse one below what they already spent."""
        with self._locked():
            state = self._read()
            shown = self.standing(state)
            delta = shown["delta"] if delta is None else delta
            total = Total(self.digest, self.name, Budget(epsilon, delta))
            spent, needed = self._bound(state, state.entries, None, total)
            if spent > epsilon:
                deltas = (f" (their deltas add up to {needed:g}: give --delta {needed:g} or more)"
                          if math.isinf(spent) else "")
                raise BudgetExceededError(f"the releases from {self.subject} already spent epsilon={spent:.4g} on "
                                          f"its worst-off example at delta {delta:g}{deltas}: a total of "
                                          f"{epsilon:g} is below it")
            kept = tuple(other for other in state.totals if other.examples != self.digest)
            state = replace(state, totals=(*kept, total))
            self._write(state)
            return state

    # --- the file ---------------------------------------------------------------------------------------------

    def read(self) -> IndividualsState:
        """The ledger as it stands (the earlier layout's folders read in first)."""
        with self._locked():
            return self._read()

    def _read(self) -> IndividualsState:
        if not self.path.exists():
            return IndividualsState()
        try:
            data = json.loads(self.path.read_text())
            if data["format"] != FORMAT:
                raise ValueError(f"format {data['format']!r}, this dpdistill reads format {FORMAT}")
            entries = tuple(Recorded(LedgerEntry.from_json(item), str(item["examples"]), str(item["data_set"]))
                            for item in data["entries"])
            totals = tuple(Total(str(item["examples"]), str(item["data_set"]),
                                 Budget(float(item["epsilon"]), float(item["delta"]))) for item in data["totals"])
            return IndividualsState(entries, totals)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError,
                CheckpointError, PrivacyParameterError) as error:
            raise CheckpointError(f"the release ledger {self.path} is damaged ({error}); it is the only record of "
                                  f"what was released from the data: repair or restore it (dpdistill will not "
                                  f"overwrite it)") from error

    def _write(self, state: IndividualsState) -> None:
        write_json(self.path, {
            "format": FORMAT,
            "entries": [{**recorded.entry.to_json(), "examples": recorded.examples, "data_set": recorded.name}
                        for recorded in state.entries],
            "totals": [{"examples": total.examples, "data_set": total.name, "epsilon": total.budget.epsilon,
                        "delta": total.budget.delta} for total in state.totals]})

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the ledger's lock between reading and rewriting it; the earlier layout's folders are read in first."""
        try:
            lock = open(self.home / LOCK_FILE, "a")
        except OSError as error:
            raise CheckpointError(f"cannot keep the release ledger in {self.home} ({error})") from error
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._migrate()
            yield

    def _migrate(self) -> None:
        """Read each ledger of the earlier layout ($DPDISTILL_LEDGER_HOME/<digest>/ledger.json: one data set's
        releases, composed by adding) into this one, its releases and total keyed by that digest; the old file is
        kept beside, renamed."""
        old = sorted(path for path in self.home.glob(f"*/{LEDGER_FILE}") if path.parent.name != EXAMPLES_DIR)
        if not old:
            return
        state = self._read()
        for path in old:
            digest = path.parent.name
            try:
                data = json.loads(path.read_text())
                entries = [LedgerEntry.from_json(item) for item in data["entries"]]
                total = data["total"]
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError,
                    CheckpointError, PrivacyParameterError) as error:
                raise CheckpointError(f"the release ledger {path} is damaged ({error}); repair or restore it") \
                    from error
            name = f"data set {digest[:8]}"
            state = replace(state, entries=(*state.entries, *(Recorded(entry, digest, name) for entry in entries)))
            if total is not None:
                budget = Budget(float(total["epsilon"]), float(total["delta"]))
                state = replace(state, totals=(*state.totals, Total(digest, name, budget)))
        self._write(state)
        for path in old:
            path.rename(path.with_name(LEDGER_FILE + MIGRATED))


@functools.lru_cache(maxsize=64)
def _examples_cached(path: str, stamp: float, digest: str) -> np.ndarray:
    return np.load(path, allow_pickle=False) if stamp else np.array([-int(digest[:15], 16) - 1], dtype=np.int64)


def _examples(path: Path, digest: str) -> np.ndarray:
    """A digest's content ids, read once per file version."""
    stamp = path.stat().st_mtime if path.exists() else 0.0
    return _examples_cached(str(path), stamp, digest)
