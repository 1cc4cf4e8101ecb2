"""The progress display: plain lines a log can keep when redirected, nothing when quiet, nothing before the run
starts; and the lifecycle tells it to start only once the run's checks have passed."""

import re
from pathlib import Path

import pytest

from dpdistill.errors import BudgetExceededError, ConfigError
from dpdistill.jobs import train_teacher
from dpdistill.progress import Pace, ProgressDisplay, announce_start, shown, with_total
from dpdistill.training.teacher import TeacherConfig


def _feed(display: ProgressDisplay, records: list[dict]) -> None:
    with display:
        display.start()
        for record in records:
            display(record)


def test_redirected_lines_give_position_rate_eta_and_figures_without_control_characters(capsys):
    _feed(ProgressDisplay("teacher on digits", 4, terminal=False, interval=0.0),
          [{"epoch": 1, "test_accuracy": 0.5}, {"epoch": 2}, {"epoch": 3, "total": 6, "test_accuracy": 0.75}])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0].startswith("teacher on digits: started, elapsed ")
    assert re.fullmatch(r"teacher on digits 1/4 elapsed \d+s, test_accuracy=0\.5", lines[1])
    assert re.fullmatch(r"teacher on digits 2/4 [\d.e+]+/s, ETA \d+s, elapsed \d+s", lines[2])
    assert lines[3].startswith("teacher on digits 3/6 ") and lines[3].endswith("test_accuracy=0.75")  # a run's total
    assert lines[4].startswith("teacher on digits: done in ") and len(lines) == 5
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", err)  # no escape, carriage return or other control character


def test_redirected_lines_between_milestones_wait_for_the_interval(capsys):
    _feed(ProgressDisplay("steps", 100, terminal=False, interval=3600.0),
          [{"step": step} for step in range(1, 50)] + [{"step": 50, "loss": 0.1}])
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ")[1] for line in lines[1:-1]] == ["50/100"]  # the milestone only: no line per step


def test_a_step_that_gives_the_position_is_not_shown_again_beside_it(capsys):
    _feed(ProgressDisplay("datalens generator steps", 146, terminal=False, interval=0.0),
          [{"step": 9, "teacher_step": 1}, {"done": 40, "step": 8, "loss": 0.5}])  # PATE: a round's step within
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith("datalens generator steps 9/146 ") and lines[1].endswith("s, teacher_step=1")
    assert lines[2].startswith("datalens generator steps 40/146 ") and lines[2].endswith(", step=8, loss=0.5")


def test_a_named_phase_counts_its_own_work_and_the_run_resumes_its_count_after_it(capsys):
    _feed(ProgressDisplay("dpsgd on fmnist", 40, terminal=False, interval=0.0),
          [{"epoch": 1}, {"phase": "features", "done": 256, "total": 512}, {"phase": "features", "done": 512,
                                                                             "total": 512},
           {"phase": "features", "cached": "9 MB kept in /cache"}, {"epoch": 2, "test_accuracy": 0.5}])
    lines = capsys.readouterr().err.splitlines()
    assert lines[1].startswith("dpsgd on fmnist 1/40 ")
    assert lines[2].startswith("features 256/512 ") and lines[3].startswith("features 512/512 ")
    assert lines[4].endswith("cached=9 MB kept in /cache")
    assert lines[5].startswith("dpsgd on fmnist 2/40 ")  # the run's own count and total again


def test_a_feature_pass_reports_its_progress_and_its_cache(fresh_features):
    import torch

    from dpdistill.models import features

    records: list[dict] = []
    images = torch.rand(600, 1, 8, 8)
    features.frozen_features(torch.nn.Flatten(), images, torch.device("cpu"), fixed=True, progress=records.append)
    batch = features.feature_batch("cpu")
    assert [record["done"] for record in records if "done" in record] == [*range(batch, 600, batch), 600]
    assert records[-1]["cached"].startswith("0 MB kept in ") and "`dpdistill cache --clear`" in records[-1]["cached"]
    assert len(features.cached_files()) == 1


def test_the_feature_cache_keeps_under_its_limit_least_recently_used_first(tmp_path: Path, monkeypatch):
    import os

    from dpdistill.models import features

    monkeypatch.setenv("DPDISTILL_HOME", str(tmp_path))
    monkeypatch.setenv("DPDISTILL_CACHE_LIMIT_GB", str(2.5e-6))  # 2,500 bytes
    folder = tmp_path / "features"
    folder.mkdir()
    for age, name in enumerate(["old.npy", "middle.safetensors", "new.npy"]):  # .safetensors: the earlier format
        (folder / name).write_bytes(b"x" * 1000)
        os.utime(folder / name, (age, age))
    assert features.trim_cache(keep=folder / "old.npy") == 1  # the limit, never the file just stored
    assert sorted(path.name for path in features.cached_files()) == ["new.npy", "old.npy"]


@pytest.mark.parametrize("terminal", [True, False])
def test_quiet_shows_nothing(capsys, terminal: bool):
    _feed(ProgressDisplay("steps", 3, quiet=True, terminal=terminal, interval=0.0), [{"step": 1, "loss": 0.5}])
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("terminal", [True, False])
def test_nothing_is_drawn_before_the_run_starts(capsys, terminal: bool):
    with ProgressDisplay("steps", 3, terminal=terminal) as display:
        assert display.bar is None
    assert capsys.readouterr() == ("", "")


class Spy:
    """A progress callable with a start(): what a display hears, in order."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    def start(self) -> None:
        self.heard.append("start")

    def __call__(self, record: dict) -> None:
        self.heard.append("record")


def test_a_plain_callable_is_not_told_to_start():
    heard = []
    announce_start(heard.append)
    assert heard == []


def test_a_job_starts_its_display_after_its_checks_and_a_refused_one_never_does(tmp_path: Path):
    spy = Spy()
    train_teacher("digits", tmp_path, TeacherConfig(epochs=1, min_steps=0, batch_size=256), progress=spy)
    assert spy.heard[0] == "start" and spy.heard.count("start") == 1 and "record" in spy.heard
    refused = Spy()
    with pytest.raises(ConfigError, match="not empty"):
        train_teacher("digits", tmp_path, TeacherConfig(epochs=1, min_steps=0, batch_size=256), progress=refused)
    assert refused.heard == []


def test_a_method_run_refused_by_its_checks_never_starts_its_display(tmp_path: Path):
    from dpdistill.pipeline import train_private
    from dpdistill.training.private import PrivateTrainingConfig

    (tmp_path / "busy.txt").write_text("someone else's")
    spy = Spy()
    with pytest.raises(ConfigError, match="not empty"):
        train_private(PrivateTrainingConfig(dataset="digits", epsilon=1.0), tmp_path, progress=spy)
    with pytest.raises(BudgetExceededError, match="would spend"):
        train_private(PrivateTrainingConfig(dataset="digits", epsilon=0.5, sigma=0.5, epochs=1), tmp_path / "new",
                      progress=spy)
    assert spy.heard == []


def test_the_api_takes_true_a_callable_or_nothing(capsys):
    with shown(False, "x") as silent, shown(None, "x") as none:
        assert silent is None and none is None
    with shown(print, "x") as given:
        assert given is print
    with shown(True, "x") as display:
        assert isinstance(display, ProgressDisplay)


def test_a_run_total_given_to_the_records_leaves_a_phases_own_count():
    records: list[dict] = []
    counting = with_total(records.append, 40)
    counting({"phase": "features", "done": 256, "total": 512})
    counting({"epoch": 1})
    assert records == [{"phase": "features", "done": 256, "total": 512}, {"epoch": 1, "total": 40}]
    assert with_total(None, 40) is None


def test_on_a_terminal_a_step_without_figures_keeps_the_last_ones_shown():
    """Loops send a record every step and their loss now and then: the loss stays on the bar in between."""
    display = ProgressDisplay("steps", 3, terminal=True)
    with display:
        display({"step": 1, "loss": 0.5})
        display({"step": 2})
        assert display.bar.tasks[0].fields["status"] == "loss=0.5" and display.bar.tasks[0].completed == 2  # 2/3


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _timed(display: ProgressDisplay, clock: FakeClock, records: list[tuple[float, dict]]) -> None:
    with display:
        display.start()
        for at, record in records:
            clock.now = at
            display(record)


@pytest.mark.parametrize("named", [True, False])
def test_each_phase_measures_its_rate_and_eta_from_its_own_start(capsys, named: bool):
    """A release's teacher counts 40 epochs in 40 s, then its transcription 10 s an iteration: the transcription's
    ETA is its own, named or not (a count that starts again is a new loop), never one from the run's start."""
    clock = FakeClock()
    teacher = [(float(epoch), {"epoch": epoch, "total": 40, **({"phase": "DP teacher"} if named else {})})
               for epoch in range(1, 41)]
    transcription = [(40.0 + 10 * step, {"iteration": step, "total": 150, **({"phase": "transcription"} if named
                                                                              else {})}) for step in (1, 2)]
    _timed(ProgressDisplay("release", 150, terminal=False, interval=0.0, clock=clock), clock,
           teacher + transcription)
    last = capsys.readouterr().err.splitlines()[-2]
    assert last == f"{'transcription' if named else 'release'} 2/150 0.1/s, ETA 24m40s, elapsed 1m00s"


def test_a_new_phase_shows_its_first_record_at_once_and_its_name(capsys):
    clock = FakeClock()
    _timed(ProgressDisplay("release", 3, terminal=False, interval=3600.0, clock=clock), clock,
           [(1.0, {"phase": "transcription", "iteration": 1, "total": 3}), (2.0, {"phase": "transcription",
                                                                                 "iteration": 2, "total": 3}),
            (3.0, {"phase": "synthetic set", "done": 1024, "total": 60000})])
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" elapsed")[0] for line in lines[1:-1]] == ["transcription 1/3", "synthetic set 1024/60000"]


def test_a_step_that_blocks_still_gets_a_line_every_interval(capsys):
    clock = FakeClock()
    with ProgressDisplay("release", 150, terminal=False, interval=10.0, clock=clock) as display:
        display.start()
        clock.now = 1.0
        display({"phase": "classifier on the synthetic set", "epoch": 3, "total": 10, "train_loss": 0.5})
        for clock.now in (5.0, 10.9):
            display.tick()  # what the heartbeat does: nothing before the interval
        assert len(capsys.readouterr().err.splitlines()) == 2
        clock.now = 11.0
        display.tick()
        (line,) = capsys.readouterr().err.splitlines()
        assert line == "classifier on the synthetic set 3/10 elapsed 11s, train_loss=0.5"


def test_a_pace_passes_a_loops_positions_at_most_every_its_seconds_and_a_steps_end_always():
    clock, heard = FakeClock(), []
    pace = Pace(heard.append, seconds=1.0, clock=clock)
    for clock.now in (0.0, 0.5, 0.99, 1.0, 1.5, 2.2):
        pace.within({"done": clock.now})
    pace({"epoch": 1})
    assert heard == [{"done": 0.0}, {"done": 1.0}, {"done": 2.2}, {"epoch": 1}]
    Pace(None).within({"done": 1})  # no progress: nothing to do


def test_a_fraction_of_a_step_is_shown_to_the_hundredth(capsys):
    _feed(ProgressDisplay("dpsgd", 40, terminal=False, interval=0.0), [{"epoch": 1.256}, {"epoch": 2}])
    assert [line.split(" ")[1] for line in capsys.readouterr().err.splitlines()[1:3]] == ["1.26/40", "2/40"]
