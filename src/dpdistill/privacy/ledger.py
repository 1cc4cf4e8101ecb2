"""A teacher's release ledger: every release made from one teacher (or ensemble), composed against a total budget.

Each run's own epsilon covers that run only; every release from the same teacher composes, so ten transcriptions
at epsilon 1 each spend far more than 1. `ledger.json` beside the teacher records each release as a dp-accounting
DpEvent, and a run reserves its planned release before its first teacher query: a reservation that would take the
composition past the total is refused. The file is rewritten atomically under a lock (two runs cannot both take
the last of a budget) and never overwritten when it cannot be read, since it is the only record of what was spent.

Neighbouring relation: replace one example, as for every teacher release (accounting.py): Gaussian events carry
std / replace-one sensitivity. `composed_epsilon` is always a sound upper bound.

A run may also read the teacher or the private data outside any mechanism (a generator trained on the unprotected
teacher, reproducible noise, no privacy at all). Such reads are `UncoveredRead`s, recorded as dp-accounting's
`NonPrivateDpEvent` among the run's events, and `coverage` derives from them, in one place, what a run's epsilon
covers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

import dp_accounting
from dp_accounting import gaussian_mechanism

from dpdistill.errors import BudgetExceededError, CheckpointError, PrivacyParameterError
from dpdistill.privacy.accounting import QuerySpec, rdp_epsilon, validate_delta, validate_epsilon
from dpdistill.privacy.accounting import composed_epsilon as query_epsilon
from dpdistill.privacy.budget import PrivacyPlan
from dpdistill.reporting.report import write_json

LEDGER_FILE = "ledger.json"
LOCK_FILE = ".ledger.lock"
LEDGER_FORMAT = 1
DEFAULT_DELTA = 1e-5  # of a total set without one, and of the spent epsilon of a ledger without total or runs
RESERVED, SPENT = "reserved", "spent"
OWN = "own release"  # a DP model's ledger: the release the model itself is
EVENT_FIELDS: dict[type, tuple[str, ...]] = {  # the dp-accounting events dpdistill records, and their fields
    dp_accounting.GaussianDpEvent: ("noise_multiplier",),
    dp_accounting.RandomizedResponseDpEvent: ("noise_parameter", "num_buckets"),
    dp_accounting.SelfComposedDpEvent: ("event", "count"),
    dp_accounting.ComposedDpEvent: ("events",),
    dp_accounting.PoissonSampledDpEvent: ("sampling_probability", "event"),
    dp_accounting.NonPrivateDpEvent: (),
    dp_accounting.NoOpDpEvent: (),
}
EVENT_CLASSES = {cls.__name__: cls for cls in EVENT_FIELDS}


def event_to_json(event: dp_accounting.DpEvent) -> dict[str, Any]:
    """{"type": class name, field: value...}, nested events likewise; only the event classes dpdistill records."""
    if type(event) not in EVENT_FIELDS:
        raise PrivacyParameterError(f"a release ledger cannot record a {type(event).__name__}; it records "
                                    f"{', '.join(EVENT_CLASSES)}")
    return {"type": type(event).__name__, **{name: _encode(getattr(event, name)) for name in EVENT_FIELDS[type(event)]}}


def _encode(value: Any) -> Any:
    if isinstance(value, dp_accounting.DpEvent):
        return event_to_json(value)
    if isinstance(value, (list, tuple)):
        return [_encode(item) for item in value]
    return value


def event_from_json(data: dict[str, Any]) -> dp_accounting.DpEvent:
    """The inverse of `event_to_json`; an unknown type is a CheckpointError."""
    name = data.get("type")
    if name not in EVENT_CLASSES:
        raise CheckpointError(f"unknown privacy event {name!r}; known: {', '.join(EVENT_CLASSES)}")
    return EVENT_CLASSES[name](**{key: _decode(value) for key, value in data.items() if key != "type"})


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        return event_from_json(value)
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


@dataclass(frozen=True)
class Release:
    """What one run releases from a teacher: its event, the (epsilon, delta) it reported, whether its noise is
    a discrete Gaussian on integer counts (recorded as the continuous Gaussian of the same sigma, whose RDP bound
    holds for it, but whose exact analytic or PLD figure is not a proven bound for it), and `failure`, a part of
    delta that is no event's: the chance, independent of the data, that the protection around the noise failed (a
    sparse secure-aggregation graph); the event's epsilon holds at delta minus it."""

    event: dp_accounting.DpEvent
    delta: float
    epsilon: float
    discrete: bool = False
    failure: float = 0.0

    @classmethod
    def of_plan(cls, plan: PrivacyPlan, count: int) -> "Release":
        # Noisy vote counts are integers with discrete Gaussian noise: the query says so itself
        return cls(plan.release_event(count), plan.request.delta, plan.epsilon(count),
                   getattr(plan.query, "discrete", False))

    @classmethod
    def of_query(cls, query: QuerySpec, count: int, delta: float, failure: float = 0.0) -> "Release":
        """`count` (at least one) answers of `query`, stated at `delta` (`failure` of it not the noise's)."""
        return cls(dp_accounting.SelfComposedDpEvent(query.dp_event(), count), delta,
                   query_epsilon(query, count, delta - failure), getattr(query, "discrete", False), failure)

    @classmethod
    def post_processing(cls, delta: float) -> "Release":
        """A release computed from an earlier DP release alone (a teacher that is itself DP, read without noise):
        nothing more is spent, recorded as dp-accounting's NoOpDpEvent."""
        return cls(dp_accounting.NoOpDpEvent(), delta, 0.0)

    def with_reads(self, reads: Sequence["UncoveredRead"]) -> "Release":
        """The release as the teacher's ledger must count it: a read no mechanism protects (its NonPrivateDpEvent)
        makes what was released from the teacher unbounded, whatever the noisy answers cost."""
        if not reads or isinstance(self.event, dp_accounting.NonPrivateDpEvent):  # nothing to add to an unbounded one
            return self
        return replace(self, event=dp_accounting.ComposedDpEvent([self.event, *(read.event for read in reads)]),
                       epsilon=math.inf)


@dataclass(frozen=True)
class UncoveredRead:
    """A read of the teacher or the private data that no mechanism protects: the outputs that depend on it have no
    formal guarantee. `covered` is what the report then says is covered; with `condition`, the words go on to say
    what the guarantee would cover where the condition holds."""

    read: str  # what was read without protection
    covered: str
    condition: str | None = None
    event: dp_accounting.DpEvent = dp_accounting.NonPrivateDpEvent()


def coverage(covers: str, reads: Sequence[UncoveredRead]) -> dict[str, Any]:
    """What a run's guarantee covers, for its report's `privacy` section: `covers` (the outputs that are
    post-processing of its releases) when nothing was read without protection; otherwise the words of the first
    uncovered read (reads are recorded from the most to the least sweeping), no formal guarantee, and every such
    read as a NonPrivateDpEvent."""
    if not reads:
        return {"covered": covers}
    first = reads[0]
    covered = first.covered if first.condition is None else f"{first.covered}; {first.condition} it would cover {covers}"
    return {"covered": covered, "formal_guarantee": False,
            "uncovered_reads": [{"event": event_to_json(read.event), "read": read.read} for read in reads]}


def reproducible_noise_read(reproducible: bool) -> list[UncoveredRead]:
    """Noise drawn from the published seed can be recomputed and removed: nothing is covered."""
    return [UncoveredRead("every noise draw, from the seed (reproducible noise, debugging only)",
                          "NO guarantee: the noise is reproducible")] if reproducible else []


@dataclass(frozen=True)
class LedgerEntry:
    """One run's release, "reserved" while it runs (or if it crashed) and "spent" once it finished."""

    out_dir: str  # the run's resolved output directory: a resumed run finds its reservation by it
    method: str
    time: str  # ISO 8601, UTC
    status: str
    release: Release
    answered: int | None = None  # an owner's entry for a federated run: the query rows its client answered

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.answered is None else {"answered": self.answered}
        extra |= {"failure": self.release.failure} if self.release.failure else {}
        return {"out_dir": self.out_dir, "method": self.method, "time": self.time, "status": self.status,
                "event": event_to_json(self.release.event), "delta": self.release.delta,
                "epsilon": self.release.epsilon, "discrete": self.release.discrete, **extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LedgerEntry":
        release = Release(event_from_json(data["event"]), float(data["delta"]), float(data["epsilon"]),
                          bool(data["discrete"]), float(data.get("failure", 0.0)))
        if data["status"] not in (RESERVED, SPENT, OWN):
            raise ValueError(f"unknown status {data['status']!r}")
        answered = data.get("answered")
        return cls(str(data["out_dir"]), str(data["method"]), str(data["time"]), data["status"], release,
                   None if answered is None else int(answered))


@dataclass(frozen=True)
class Budget:
    """The total (epsilon, delta) the data owner allows every release from the teacher to spend together."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        validate_epsilon(self.epsilon)
        validate_delta(self.delta)


@dataclass(frozen=True)
class LedgerState:
    """The contents of ledger.json."""

    total: Budget | None
    entries: tuple[LedgerEntry, ...] = ()

    @property
    def delta(self) -> float:
        """The delta the spent epsilon is stated at: the total's, else the largest a release from the model used,
        plus the model's own release's (`ledger_epsilon` adds that one)."""
        if self.total is not None:
            return self.total.delta
        own = sum(entry.release.delta for entry in self.entries if entry.status == OWN)
        made = max((entry.release.delta for entry in self.entries if entry.status != OWN), default=0.0)
        return own + made or DEFAULT_DELTA

    def spent(self, delta: float | None = None) -> float:
        return ledger_epsilon(self.entries, self.delta if delta is None else delta)

    def reservation(self, out_dir: str) -> int | None:
        """Index of the latest reservation the run writing `out_dir` holds."""
        return next((index for index in reversed(range(len(self.entries)))
                     if self.entries[index].out_dir == out_dir and self.entries[index].status == RESERVED), None)


def ledger_epsilon(entries: Sequence[LedgerEntry], delta: float, added: Release | None = None) -> float:
    """Sound epsilon at `delta` of a ledger's entries and `added`: the releases made from the model composed
    exactly (`composed_epsilon`; post-processing adds nothing), and a DP model's own release (status OWN), of
    whose mechanism the ledger may know only the stated (epsilon, delta), added to them (basic composition)."""
    own = [entry.release for entry in entries if entry.status == OWN]
    made = [release for release in [*(entry.release for entry in entries if entry.status != OWN), added]
            if release is not None and not isinstance(release.event, dp_accounting.NoOpDpEvent)]
    own_epsilon, own_delta = sum(release.epsilon for release in own), sum(release.delta for release in own)
    if not made:
        return own_epsilon if own_delta <= delta * (1 + 1e-9) else math.inf
    return math.inf if own_delta >= delta else own_epsilon + composed_epsilon(made, delta - own_delta)


def composed_epsilon(releases: Sequence[Release], delta: float) -> float:
    """Sound epsilon at `delta` of all `releases` together.

    One release: the epsilon it reported (the figure the run calibrated to), if stated at `delta` or smaller.
    Otherwise the events compose at `delta` less the releases' failure terms (`Release.failure`). Only continuous
    Gaussians: exact, since they compose to one Gaussian whose mu^2 is the sum of theirs.
    Otherwise dp-accounting's RDP accountant under replace-one neighbours: it takes Gaussian multipliers as given
    (ours are std / replace-one sensitivity), bounds the discrete Gaussian too, and counts randomized response
    correctly (its PLD accountant ignores the count of a self-composed randomized response).
    """
    validate_delta(delta)
    if not releases:
        return 0.0
    if len(releases) == 1 and releases[0].delta <= delta:
        return releases[0].epsilon
    failure = sum(release.failure for release in releases)
    if failure >= delta:
        return math.inf
    delta -= failure
    if not any(release.discrete for release in releases):
        squares = [_gaussian_mu_squared(release.event) for release in releases]
        if None not in squares:
            mu_squared = sum(squares)
            return 0.0 if mu_squared == 0 else gaussian_mechanism.get_epsilon_gaussian(1 / math.sqrt(mu_squared), delta)
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.ComposedDpEvent([release.event for release in releases])
    if not accountant.supports(event):
        raise PrivacyParameterError(f"the RDP accountant cannot compose these releases under replace-one "
                                    f"neighbours: {event}")
    return rdp_epsilon(accountant, event, delta)


def composed_release(releases: Sequence[Release], delta: float) -> Release:
    """`releases` as one: their events composed, their sound `composed_epsilon` at `delta`."""
    return Release(dp_accounting.ComposedDpEvent([release.event for release in releases]), delta,
                   composed_epsilon(releases, delta), any(release.discrete for release in releases),
                   sum(release.failure for release in releases))


def _gaussian_mu_squared(event: dp_accounting.DpEvent) -> float | None:
    """sum of count / z^2 over an event made of Gaussians only (mu^2 of the one Gaussian they compose to)."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return event.noise_multiplier ** -2
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner = _gaussian_mu_squared(event.event)
        return None if inner is None else event.count * inner
    if isinstance(event, dp_accounting.ComposedDpEvent):
        parts = [_gaussian_mu_squared(part) for part in event.events]
        return None if None in parts else sum(parts)
    return None


class ReleaseLedger:
    """ledger.json in a teacher's (or ensemble's) directory; a directory without one has spent nothing yet."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LEDGER_FILE

    @property
    def subject(self) -> str:
        """What the ledger's releases come from, in an error message."""
        return f"the teacher in {self.directory}"

    @property
    def raise_total(self) -> str:
        """The command that raises its total."""
        return f"dpdistill budget {self.directory} --set EPS"

    def read(self) -> LedgerState:
        if not self.path.exists():
            return LedgerState(None)
        try:
            data = json.loads(self.path.read_text())
            if data["format"] != LEDGER_FORMAT:
                raise ValueError(f"format {data['format']!r}, this dpdistill reads format {LEDGER_FORMAT}")
            total = None if data["total"] is None else Budget(float(data["total"]["epsilon"]),
                                                              float(data["total"]["delta"]))
            return LedgerState(total, tuple(LedgerEntry.from_json(entry) for entry in data["entries"]))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError,
                CheckpointError, PrivacyParameterError) as error:
            raise CheckpointError(f"the release ledger {self.path} is damaged ({error}); it is the only record of "
                                  f"what this teacher has released: repair or restore it (dpdistill will not "
                                  f"overwrite it)") from error

    def standing(self, state: LedgerState) -> dict[str, Any]:
        """Total, spent and remaining epsilon (functions of public epsilons only): a report's `ledger` section."""
        spent = state.spent()
        total = None if state.total is None else state.total.epsilon
        return {"path": str(self.path), "total_epsilon": total, "delta": state.delta, "spent_epsilon": spent,
                "remaining": None if total is None else total - spent}

    def reserve(self, out_dir: Path, method: str, release: Release, resume: bool = False) -> LedgerState:
        """Record the release the run writing `out_dir` plans, before it asks the teacher anything; refuse it if
        the composition of every release would exceed the total. A resumed run keeps its reservation."""
        key = str(out_dir.resolve())
        with self._locked():
            state = self.read()
            if resume and state.reservation(key) is not None:
                return state
            self._refuse_past_total(state, state.entries, release)
            now = datetime.now(timezone.utc).isoformat(timespec="seconds")
            state = replace(state, entries=(*state.entries, LedgerEntry(key, method, now, RESERVED, release)))
            self._write(state)
            return state

    def _refuse_past_total(self, state: LedgerState, kept: Sequence[LedgerEntry], release: Release) -> None:
        """Refuse `release` if, composed with the `kept` entries, it would pass the total."""
        if state.total is None:
            return
        after = ledger_epsilon(kept, state.total.delta, release)
        if after > state.total.epsilon:
            spent = state.spent()
            raise BudgetExceededError(
                f"this release would take {self.subject} past its privacy budget: its "
                f"releases so far spent epsilon={spent:.4g} of {state.total.epsilon:g} (delta "
                f"{state.total.delta:g}), {state.total.epsilon - spent:.4g} remain; this run's "
                f"epsilon={release.epsilon:.4g} would bring the total to {after:.4g}. Lower "
                f"--epsilon, or let the data owner raise the total with `{self.raise_total}`")

    def answer(self, run: str, query: QuerySpec, rows: int, planned: int, delta: float,
               failure: float = 0.0) -> LedgerState:
        """A data owner's ledger as its client answers a federated run round by round, before each answer: the
        first reserves the run's `planned` rows of `query`, every row answered counts, rows past the plan (a round
        asked again after a failure) raise the charge. Refused past the total, and when the run's noise or
        terms change under the same run."""
        key = f"federated run {run}"
        with self._locked():
            state = self.read()
            earlier = next((entry for entry in state.entries if entry.out_dir == key), None)
            if earlier is not None:
                if (getattr(earlier.release.event, "event", None) != query.dp_event()
                        or (earlier.release.delta, earlier.release.failure) != (delta, failure)):
                    raise BudgetExceededError(f"federated run {run} changed its noise or terms after this owner's "
                                              f"first answer: refused")
                rows += earlier.answered or 0
            release = Release.of_query(query, max(planned, rows), delta, failure)
            kept = [entry for entry in state.entries if entry.out_dir != key]
            self._refuse_past_total(state, kept, release)
            now = datetime.now(timezone.utc).isoformat(timespec="seconds")
            state = replace(state, entries=(*kept, LedgerEntry(key, "federated answers", now, SPENT, release, rows)))
            self._write(state)
            return state

    def record_own(self, method: str, release: Release) -> LedgerState:
        """Record the release the DP model in this directory is (once: its run's, or the DP teacher's it was
        transcribed from): every later release from the model composes with it, and no total below it can be
        set."""
        with self._locked():
            state = self.read()
            kept = tuple(entry for entry in state.entries if entry.status != OWN)
            own = LedgerEntry(str(self.directory.resolve()), method, datetime.now(timezone.utc).isoformat(
                timespec="seconds"), OWN, release)
            state = replace(state, entries=(own, *kept))
            self._write(state)
            return state

    def own(self) -> Release | None:
        """The release the model in this directory is, where its ledger records it."""
        return next((entry.release for entry in self.read().entries if entry.status == OWN), None)

    def withdraw(self, out_dir: Path) -> LedgerState:
        """Drop the reservation of the run writing `out_dir`, which failed before it asked anything: nothing was
        released, so nothing is spent."""
        key = str(out_dir.resolve())
        with self._locked():
            state = self.read()
            index = state.reservation(key)
            if index is None:
                return state
            state = replace(state, entries=state.entries[:index] + state.entries[index + 1:])
            self._write(state)
            return state

    def settle(self, out_dir: Path, method: str, release: Release) -> LedgerState:
        """Mark the reservation of the run writing `out_dir` spent, with the release it actually made."""
        key = str(out_dir.resolve())
        with self._locked():
            state = self.read()
            index = state.reservation(key)
            now = datetime.now(timezone.utc).isoformat(timespec="seconds")
            entries = list(state.entries)
            if index is None:  # the ledger was replaced while the run went on: record the release all the same
                entries.append(LedgerEntry(key, method, now, SPENT, release))
            else:
                entries[index] = replace(entries[index], status=SPENT, release=release)
            state = replace(state, entries=tuple(entries))
            self._write(state)
            return state

    def set_total(self, epsilon: float, delta: float | None = None) -> LedgerState:
        """Set or change the total budget (`delta` None: the delta the spent epsilon is stated at,
        `LedgerState.delta`); refuse one below what the recorded releases already spent."""
        with self._locked():
            state = self.read()
            delta = state.delta if delta is None else delta
            total = Budget(epsilon, delta)
            spent = state.spent(delta)
            if spent > epsilon:
                raise BudgetExceededError(f"the releases from {self.subject} already spent epsilon={spent:.4g} at "
                                          f"delta {delta:g}: a total of {epsilon:g} is below it")
            state = replace(state, total=total)
            self._write(state)
            return state

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the ledger's lock between reading and rewriting it (a separate file: rewrites replace ledger.json)."""
        try:
            lock = open(self.directory / LOCK_FILE, "a")
        except OSError as error:
            raise CheckpointError(f"cannot keep the release ledger in {self.directory} ({error})") from error
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _write(self, state: LedgerState) -> None:
        total = None if state.total is None else {"epsilon": state.total.epsilon, "delta": state.total.delta}
        write_json(self.path, {"format": LEDGER_FORMAT, "total": total,
                               "entries": [entry.to_json() for entry in state.entries]})
