"""The release ledger: exact composition of every release from one teacher, reservations before the first query,
refusals that write nothing and ask nothing, resumes that reserve once, a lock, and a damaged file kept."""

import json
import shutil
import threading
import time
from pathlib import Path

import dp_accounting
import pytest

from dpdistill import pipeline
from dpdistill.errors import BudgetExceededError, CheckpointError, ConfigError, PrivacyParameterError
from dpdistill.methods.config import build_config
from dpdistill.methods.engine import TranscriptionEngine
from dpdistill.methods.pate import PateConfig
from dpdistill.privacy.accounting import RandomizedResponseQuery
from dpdistill.privacy.ledger import (LEDGER_FILE, LOCK_FILE, RESERVED, SPENT, Release, ReleaseLedger,
                                      composed_epsilon, event_from_json, event_to_json)

from helpers import TeacherReads, exact_gaussian

DELTA = 1e-5


def _gaussian(epsilon: float, count: int = 320, discrete: bool = False) -> Release:
    """A release of `count` Gaussian answers calibrated to `epsilon`, as a run reports it."""
    query = exact_gaussian(count, epsilon, DELTA)
    event = dp_accounting.SelfComposedDpEvent(query.dp_event(), count)
    return Release(event, DELTA, query.epsilon(count, DELTA), discrete)


def test_two_releases_calibrated_to_0_6_compose_exactly_to_0_876():
    release = _gaussian(0.6)
    assert composed_epsilon([release], DELTA) == release.epsilon == pytest.approx(0.6)
    assert composed_epsilon([release, release], DELTA) == pytest.approx(0.87649, abs=1e-5)
    assert composed_epsilon([release, _gaussian(0.8, count=64)], DELTA) == pytest.approx(1.0319, abs=1e-4)
    assert composed_epsilon([release] * 3, DELTA) > 1


def test_a_single_release_stated_at_a_larger_delta_is_recomposed_at_the_ledgers():
    query = exact_gaussian(100, 1.0, 1e-3)
    release = Release(dp_accounting.SelfComposedDpEvent(query.dp_event(), 100), 1e-3, 1.0)
    assert composed_epsilon([release], 1e-3) == 1.0
    assert composed_epsilon([release], DELTA) == pytest.approx(query.epsilon(100, DELTA))
    assert composed_epsilon([release], DELTA) > 1.5


def test_randomized_response_composes_by_rdp_with_its_count():
    # The privacy note's table: k = 3, eps0 = 0.01, 51,200 answers: RDP 9.75 (exact 9.08); PLD would say 0.01
    query = RandomizedResponseQuery(0.01, 3)
    half = Release(dp_accounting.SelfComposedDpEvent(query.dp_event(), 25_600), DELTA, query.epsilon(25_600, DELTA))
    assert composed_epsilon([half, half], DELTA) == pytest.approx(9.75, abs=0.01)


def test_discrete_and_mixed_ledgers_compose_by_rdp_under_replace_one():
    # Vote counts at the continuous sigma for 0.6 each (20 answers): RDP 0.9586 for two, not the exact 0.876
    votes = _gaussian(0.6, count=20, discrete=True)
    assert composed_epsilon([votes, votes], DELTA) == pytest.approx(0.95856, abs=1e-4)
    labels = RandomizedResponseQuery(0.5, 3)
    label_release = Release(dp_accounting.SelfComposedDpEvent(labels.dp_event(), 10), DELTA, 3.0)
    data = _gaussian(0.6)
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.ComposedDpEvent([data.event, label_release.event]))
    mixed = composed_epsilon([data, label_release], DELTA)
    assert mixed == pytest.approx(accountant.get_epsilon(DELTA)) and mixed > composed_epsilon([data], DELTA)


def test_a_non_private_release_spends_everything_and_no_release_nothing():
    unprotected = Release(dp_accounting.NonPrivateDpEvent(), DELTA, float("inf"))
    assert composed_epsilon([unprotected], DELTA) == float("inf")
    assert composed_epsilon([_gaussian(0.6), unprotected], DELTA) == float("inf")
    assert composed_epsilon([], DELTA) == 0
    assert composed_epsilon([Release(dp_accounting.NoOpDpEvent(), DELTA, 0.0)] * 2, DELTA) == 0


def test_events_survive_json_and_unknown_ones_are_refused():
    event = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.5), 7),
        dp_accounting.RandomizedResponseDpEvent(0.3, 4),
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)),
        dp_accounting.NonPrivateDpEvent(), dp_accounting.NoOpDpEvent()])
    assert event_from_json(json.loads(json.dumps(event_to_json(event)))) == event
    with pytest.raises(PrivacyParameterError, match="cannot record a LaplaceDpEvent"):
        event_to_json(dp_accounting.LaplaceDpEvent(1.0))
    with pytest.raises(CheckpointError, match="unknown privacy event 'LaplaceDpEvent'"):
        event_from_json({"type": "LaplaceDpEvent", "noise_multiplier": 1.0})


def test_a_total_refuses_what_would_overspend_and_never_falls_below_what_is_spent(tmp_path: Path):
    ledger = ReleaseLedger(tmp_path)
    ledger.reserve(tmp_path / "first", "dpsd", _gaussian(0.6))
    ledger.reserve(tmp_path / "second", "dpsd", _gaussian(0.6))  # no total: recorded, never refused
    ledger.reserve(tmp_path / "third", "dpsd", _gaussian(0.6))
    with pytest.raises(BudgetExceededError, match=r"already spent epsilon=1\.095 at delta 1e-05: a total of 1 is"):
        ledger.set_total(1.0)
    state = ledger.set_total(1.5)
    assert state.total.delta == DELTA and len(state.entries) == 3
    with pytest.raises(BudgetExceededError, match=r"spent epsilon=1\.095 of 1\.5 .* to 1\.537"):
        ledger.reserve(tmp_path / "fourth", "dpsd", _gaussian(1.0))
    assert len(ledger.read().entries) == 3
    assert ledger.reserve(tmp_path / "fourth", "dpsd", _gaussian(0.5)).spent() <= 1.5


def test_a_damaged_ledger_is_a_clear_error_and_is_kept(tmp_path: Path):
    damaged = '{"format": 1, "total": null, "entries": [{"out_dir": '
    (tmp_path / LEDGER_FILE).write_text(damaged)
    with pytest.raises(CheckpointError, match=f"the release ledger {tmp_path / LEDGER_FILE} is damaged"):
        ReleaseLedger(tmp_path).reserve(tmp_path / "run", "dpsd", _gaussian(0.6))
    assert (tmp_path / LEDGER_FILE).read_text() == damaged


def test_two_concurrent_reservations_cannot_both_take_the_last_of_a_budget(tmp_path: Path, monkeypatch):
    ReleaseLedger(tmp_path).set_total(1.0)
    read = ReleaseLedger.read

    def slow_read(self):  # widens the window between reading and rewriting the ledger
        state = read(self)
        time.sleep(0.3)
        return state

    monkeypatch.setattr(ReleaseLedger, "read", slow_read)
    outcomes: list[str] = []

    def reserve(name: str) -> None:
        try:
            ReleaseLedger(tmp_path).reserve(tmp_path / name, "dpsd", _gaussian(0.8))
            outcomes.append("reserved")
        except BudgetExceededError:
            outcomes.append("refused")

    threads = [threading.Thread(target=reserve, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused", "reserved"]
    assert len(read(ReleaseLedger(tmp_path)).entries) == 1


# --- through the real pipelines -------------------------------------------------------------------------------

def _copy(teacher: Path, tmp_path: Path) -> Path:
    """The session's teacher without its ledger: a total set here must not refuse other tests' runs."""
    return Path(shutil.copytree(teacher, tmp_path / "teacher",
                                ignore=shutil.ignore_patterns(LEDGER_FILE, LOCK_FILE, ".lock")))


def _transcription(epsilon: float, **overrides):
    values = {"iterations": 2, "batch_size": 16, "eval_every": 2, "checkpoint_every": 100} | overrides
    return build_config("demo", values, {"mode": "data", "epsilon": epsilon})


def test_transcriptions_at_0_6_fit_a_total_of_1_twice_and_the_third_is_refused_unasked(
        digits_teacher: Path, tmp_path: Path, teacher_reads: TeacherReads):
    teacher = _copy(digits_teacher, tmp_path)
    ReleaseLedger(teacher).set_total(1.0)
    first = pipeline.transcribe(teacher, _transcription(0.6), tmp_path / "first", "digits")
    assert first["privacy"]["ledger"] == {"path": str(teacher / LEDGER_FILE), "total_epsilon": 1.0, "delta": DELTA,
                                          "spent_epsilon": first["privacy"]["epsilon"],
                                          "remaining": 1.0 - first["privacy"]["epsilon"]}
    second = pipeline.transcribe(teacher, _transcription(0.6), tmp_path / "second", "digits")
    # two releases of exactly 0.6 compose to 0.87649; calibration stops within 0.01% below each run's budget
    assert 0.87649 * (1 - 1e-4) <= second["privacy"]["ledger"]["spent_epsilon"] <= 0.87649
    assert teacher_reads.calls  # the counter sees the teacher's answers
    teacher_reads.calls.clear()
    with pytest.raises(BudgetExceededError, match=r"spent epsilon=0\.8765 of 1 .* 0\.1235 remain"):
        pipeline.transcribe(teacher, _transcription(0.6), tmp_path / "nested" / "third", "digits")
    assert teacher_reads.calls == []
    assert not (tmp_path / "nested").exists()
    entries = ReleaseLedger(teacher).read().entries
    assert [(entry.method, entry.status) for entry in entries] == [("dpsd", SPENT)] * 2
    assert entries[0].out_dir == str((tmp_path / "first").resolve())
    assert entries[0].release.event == dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(first["privacy"]["noise_multiplier"]), first["privacy"]["queries"])


def test_a_second_transcription_at_0_8_after_0_6_is_refused(digits_teacher: Path, tmp_path: Path):
    teacher = _copy(digits_teacher, tmp_path)
    ReleaseLedger(teacher).set_total(1.0)
    pipeline.transcribe(teacher, _transcription(0.6), tmp_path / "first", "digits")
    with pytest.raises(BudgetExceededError, match=r"this run's epsilon=0\.8 would bring the total to 1\.03"):
        pipeline.transcribe(teacher, _transcription(0.8), tmp_path / "second", "digits")
    assert not (tmp_path / "second").exists()


def test_a_resumed_transcription_keeps_its_reservation(digits_teacher: Path, tmp_path: Path):
    teacher = _copy(digits_teacher, tmp_path)
    ReleaseLedger(teacher).set_total(1.0)  # a second reservation at 0.8 would be refused

    def interrupt(record: dict) -> None:
        if record["iteration"] == 3:
            raise KeyboardInterrupt

    config = _transcription(0.8, iterations=4, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        pipeline.transcribe(teacher, config, tmp_path / "run", "digits", progress=interrupt)
    [crashed] = ReleaseLedger(teacher).read().entries
    assert crashed.status == RESERVED and crashed.release.epsilon == pytest.approx(0.8, rel=1e-4)
    report = pipeline.transcribe(teacher, config, tmp_path / "run", "digits", resume=True)
    [entry] = ReleaseLedger(teacher).read().entries
    assert entry.status == SPENT and entry.time == crashed.time
    assert entry.release.event.count == report["privacy"]["queries"] == 64
    assert report["privacy"]["ledger"]["spent_epsilon"] == pytest.approx(0.8, rel=1e-4)


def test_a_run_without_privacy_spends_everything_and_is_refused_under_a_total(digits_teacher: Path, tmp_path: Path):
    teacher = _copy(digits_teacher, tmp_path)
    config = build_config("demo", {"iterations": 1, "batch_size": 8}, {"mode": "none", "epsilon": None})
    report = pipeline.transcribe(teacher, config, tmp_path / "open", "digits")
    assert report["privacy"]["ledger"]["spent_epsilon"] == float("inf")
    assert ReleaseLedger(teacher).read().entries[0].release.event == dp_accounting.NonPrivateDpEvent()
    with pytest.raises(BudgetExceededError, match="spent epsilon=inf"):
        ReleaseLedger(teacher).set_total(10.0)
    fresh = _copy(digits_teacher, tmp_path / "other")
    ReleaseLedger(fresh).set_total(10.0)
    with pytest.raises(BudgetExceededError, match="this run's epsilon=inf"):
        pipeline.transcribe(fresh, config, tmp_path / "refused", "digits")
    assert not (tmp_path / "refused").exists()


def test_pate_runs_at_0_6_fit_a_total_of_1_twice_by_rdp_and_the_third_is_refused_unasked(
        digits_ensemble: Path, tmp_path: Path, teacher_reads: TeacherReads):
    ensemble = _copy(digits_ensemble, tmp_path)
    ReleaseLedger(ensemble).set_total(1.0)
    config = PateConfig(epsilon=0.6, queries=20, public_size=200, epochs=1, min_steps=5, self_training_rounds=0)
    pipeline.pate(ensemble, config, tmp_path / "first")
    second = pipeline.pate(ensemble, config, tmp_path / "second")
    # vote counts get discrete Gaussian noise (sigma 0.01% above the continuous one): composed by RDP, 0.9585;
    # each run's sigma is calibrated to a relative 1e-4, which moves the composition by about as much
    assert second["privacy"]["ledger"]["spent_epsilon"] == pytest.approx(0.95846, rel=2e-4)
    assert [entry.release.discrete for entry in ReleaseLedger(ensemble).read().entries] == [True, True]
    teacher_reads.calls.clear()
    with pytest.raises(BudgetExceededError, match="would bring the total to 1.19"):
        pipeline.pate(ensemble, config, tmp_path / "third")
    assert teacher_reads.calls == [] and not (tmp_path / "third").exists()


def test_a_pate_refused_for_its_public_pool_reserves_nothing(digits_ensemble: Path, tmp_path: Path):
    ensemble = _copy(digits_ensemble, tmp_path)
    pipeline.pate(ensemble, PateConfig(epsilon=0.6, queries=20, public_size=200, epochs=1, min_steps=5,
                                       self_training_rounds=0), tmp_path / "first")
    spent = ReleaseLedger(ensemble).read().spent()
    with pytest.raises(ConfigError, match="leaves none to measure accuracy on"):  # digits' test split: 360 images
        pipeline.pate(ensemble, PateConfig(epsilon=1, queries=20, public_size=5000), tmp_path / "refused")
    assert ReleaseLedger(ensemble).read().spent() == spent and not (tmp_path / "refused").exists()


@pytest.mark.parametrize("asked", [False, True])
def test_a_run_that_fails_before_its_first_query_keeps_no_reservation(digits_teacher: Path, tmp_path: Path,
                                                                      monkeypatch, asked: bool):
    teacher = _copy(digits_teacher, tmp_path)
    engine_run = TranscriptionEngine.run

    def fail(engine: TranscriptionEngine, resume: bool = False):
        if asked:  # the loop began: the teacher may have answered
            engine.started = True
        raise RuntimeError("the machine went down")

    monkeypatch.setattr(TranscriptionEngine, "run", fail)
    with pytest.raises(RuntimeError):
        pipeline.transcribe(teacher, _transcription(0.8), tmp_path / "run", "digits")
    entries = ReleaseLedger(teacher).read().entries
    assert [entry.status for entry in entries] == ([RESERVED] if asked else [])
    monkeypatch.setattr(TranscriptionEngine, "run", engine_run)
    overwritten = pipeline.transcribe(teacher, _transcription(0.8), tmp_path / "run", "digits", overwrite=True)
    # the one that failed unasked left nothing; one that may have asked keeps its charge beside the new run's
    assert overwritten["privacy"]["ledger"]["spent_epsilon"] == pytest.approx(
        composed_epsilon([entry.release for entry in ReleaseLedger(teacher).read().entries], DELTA))
    assert len(ReleaseLedger(teacher).read().entries) == (2 if asked else 1)
