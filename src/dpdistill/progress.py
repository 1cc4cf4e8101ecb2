"""How long work says how far it is: a callable taking one record per step (a dict such as {"epoch": 3, "total":
10, "test_accuracy": 0.9}), and the one display that shows those records to a person. A record naming a "phase"
(features, members, answers) counts that phase's own work; the run's count resumes with its next record without
one.

The library prints nothing by itself: a run reports only to the callable it is given. The command line, and an
API caller who passes `progress=True`, get a `ProgressDisplay` on stderr: a bar on a terminal, plain lines a log
can keep when the output is redirected, nothing when quiet."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as Bar

Progress = Callable[[dict], None]
Clock = Callable[[], float]

# where a record says how far it is, and what a display shows beside the position
POSITION_KEYS = ("done", "iteration", "epoch", "member", "owner", "round", "step")
SHOWN_KEYS = ("student_accuracy", "test_accuracy", "student_loss", "queries", "train_loss", "step",
              "confident_share", "loss", "vae_loss", "generator_loss", "cached", "teacher_step")
# records that mark a milestone (an evaluation, a finished phase step): a redirected display logs each one
MILESTONE_KEYS = ("student_accuracy", "test_accuracy", "pretrain_step", "confident_share", "loss", "vae_loss",
                  "cached")
LOG_INTERVAL_SECONDS = 10.0  # at most between two plain lines, whether records come or a step blocks
PACE_SECONDS = 1.0  # between two records of a loop's position within a long step (Pace)


def with_total(progress: Progress | None, total: int) -> Progress | None:
    """`progress`, told that the run's own count ends at `total` (a named phase keeps its own)."""
    if progress is None:
        return None
    return lambda record: progress(record if "phase" in record else {**record, "total": total})


def in_phase(progress: Progress | None, phase: str, total: int | None = None) -> Progress | None:
    """`progress`, each record counted as part of the named `phase` (ending at `total`, where given); one that
    names a phase of its own is that part of this one ("DP teacher (DP-SGD): features")."""
    if progress is None:
        return None
    added = {"phase": phase, **({} if total is None else {"total": total})}
    return lambda record: progress({**record, "phase": f"{phase}: {record['phase']}"} if "phase" in record
                                   else {**record, **added})


def announce_start(progress: Progress | None) -> None:
    """Tell a display that the run's checks have passed and its long work begins: it draws nothing before (or
    before the first record), so that a refused run prints its error alone. A plain callable only gets records."""
    start = getattr(progress, "start", None)
    if callable(start):
        start()


class Pace:
    """A loop's position within a long step (the batches of an epoch, of a synthetic set), passed on at most every
    `seconds` by `within`, and always by a call (the step's end): a display then has a fresh position to show at
    least every few seconds, and a caller's callable hears a record a second rather than one a batch."""

    def __init__(self, progress: Progress | None, seconds: float | None = None, clock: Clock = time.monotonic) -> None:
        self.progress, self.clock = progress, clock
        self.seconds = PACE_SECONDS if seconds is None else seconds
        self.last = -float("inf")

    def __call__(self, record: dict) -> None:
        if self.progress is not None:
            self.last = self.clock()
            self.progress(record)

    def within(self, record: dict) -> None:
        if self.progress is not None and self.clock() - self.last >= self.seconds:
            self(record)


class ProgressDisplay:
    """Shows a run's records on stderr: a bar on a terminal; when the output is redirected, one plain line (phase,
    position, rate, ETA, latest figures) at each milestone, at each phase's first record, and at least every
    `interval` seconds (a heartbeat repeats the position when a step blocks longer), with no control characters;
    nothing at all when `quiet`. Draws nothing before the run's first record.

    `total` is where the count ends; a record's "total" replaces it where only the run knows the end (a teacher's
    epochs raised to reach --min-steps). Each phase's rate and ETA are measured from its own first record, and a
    count that goes back (a new loop under the same name) starts its measure again."""

    def __init__(self, description: str, total: int | None = None, quiet: bool = False,
                 terminal: bool | None = None, interval: float = LOG_INTERVAL_SECONDS, clock: Clock = time.monotonic
                 ) -> None:
        self.description, self.total, self.quiet, self.interval, self.clock = description, total, quiet, interval, clock
        self.terminal = Console(stderr=True).is_terminal if terminal is None else terminal
        self.created = clock()
        self.first: tuple[float, float] | None = None  # when and where the count began: the rate is measured from there
        self.last_line = -float("inf")
        self.position: float | None = None
        self.figures: list[str] = []  # the latest record's, repeated by a heartbeat
        self.phase: str | None = None  # the named phase under way (None: the run's own count)
        self.status: dict[str, str] = {}  # the figures on a terminal's bar, each the last given (this phase's)
        self.run_count: tuple[int | None, float | None] = (total, None)  # the run's total and position, kept meanwhile
        self.bar: Bar | None = None
        self.task = None
        self.lock = threading.Lock()  # the heartbeat's thread and the run's share the lines
        self.stopped = threading.Event()

    def __enter__(self) -> "ProgressDisplay":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        if self.bar is not None:
            self.bar.stop()
        elif not self.quiet and self.last_line > -float("inf") and exc_info[0] is None:
            self._line(f"{self.description}: done in {_duration(self.clock() - self.created)}")

    def start(self) -> None:
        """The run's checks have passed: show that it began (and, redirected, keep a line coming every interval)."""
        if self.quiet or self.bar is not None or self.last_line > -float("inf"):
            return
        if self.terminal:
            self._draw("")
            return
        self.last_line = self.clock()
        self._line(self._plain(self.last_line, started=True))
        if self.interval > 0:
            threading.Thread(target=self._heartbeat, daemon=True, name="progress heartbeat").start()

    def _heartbeat(self) -> None:
        while not self.stopped.wait(max(0.05, self.last_line + self.interval - self.clock())):
            self.tick()

    def tick(self) -> None:
        """A line with the position as it stands when none was written for `interval` seconds: a step that blocks
        (an evaluation, a feature pass of one large batch) still shows the run alive."""
        with self.lock:
            now = self.clock()
            if not self.stopped.is_set() and self.last_line > -float("inf") and now - self.last_line >= self.interval:
                self.last_line = now
                self._line(self._plain(now))

    def __call__(self, record: dict) -> None:
        if self.quiet:
            return
        with self.lock:
            self._record(record)

    def _record(self, record: dict) -> None:
        switched = record.get("phase") != self.phase
        if switched:
            self._switch(record.get("phase"))
        self.total = record.get("total", self.total)
        counted = next((key for key in POSITION_KEYS if key in record), None)
        now = self.clock()
        if counted is not None:
            previous, self.position = self.position, record[counted]
            if self.first is None or (previous is not None and self.position < previous):  # a count that starts
                self.first = (now, self.position)  # again (the next loop): its rate is its own
        shown = {key: f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
                 for key, value in record.items() if key in SHOWN_KEYS and key != counted}  # not the position twice
        self.figures = list(shown.values())
        if self.terminal:  # the bar keeps each figure until a record gives it anew (loops send a loss now and then)
            self.status.update(shown)
            self._draw("  ".join(self.status.values()))
        elif switched or any(key in record for key in MILESTONE_KEYS) or now - self.last_line >= self.interval:
            self.last_line = now
            self._line(self._plain(now))

    def _switch(self, phase: str | None) -> None:
        """A named phase begins (its own count), or ends and the run's count resumes where it was."""
        if self.phase is None:
            self.run_count = (self.total, self.position)
        self.phase, self.first, self.status = phase, None, {}
        self.total, self.position = (None, None) if phase is not None else self.run_count
        if self.bar is not None:
            self.bar.update(self.task, description=phase or self.description)

    def _draw(self, status: str) -> None:
        if self.bar is None:
            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                           console=Console(stderr=True), transient=False)
            self.task = self.bar.add_task(self.description, total=self.total, status="")
            self.bar.start()
        # a record without a position (pretraining's loss) keeps the bar where it is
        self.bar.update(self.task, total=self.total, completed=self.position, status=status)

    def _plain(self, now: float, started: bool = False) -> str:
        """'phase position/total rate, ETA, elapsed, figures': the position first, where a log reader looks."""
        facts = []
        if self.position is None:
            head = f"{self.phase or self.description}:"
            facts += ["started"] if started else []
        else:
            head = f"{self.phase or self.description} {_count(self.position)}/{'?' if self.total is None else self.total}"
            moved, seconds = self.position - self.first[1], now - self.first[0]
            if moved > 0 and seconds > 0:
                facts.append(f"{moved / seconds:.3g}/s")
                if self.total is not None and self.total >= self.position:
                    facts.append(f"ETA {_duration((self.total - self.position) * seconds / moved)}")
        facts.append(f"elapsed {_duration(now - self.created)}")
        return f"{head} {', '.join([*facts, *([] if started else self.figures)])}"

    @staticmethod
    def _line(text: str) -> None:
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def shown(progress: Progress | bool | None, description: str, total: int | None = None) -> Iterator[Progress | None]:
    """The Python API's `progress` argument as the callable a run takes: None or False, silent; True, a display on
    stderr; a callable, itself."""
    if progress is True:
        with ProgressDisplay(description, total) as display:
            yield display
    else:
        yield progress or None


def _count(position: float) -> str:
    """A position as a log shows it: whole steps as they are, a step's fraction (an epoch under way) to 0.01."""
    return str(position) if isinstance(position, int) else f"{position:.2f}".rstrip("0").rstrip(".")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"
