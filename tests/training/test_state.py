"""When a resumable loop saves: at its step count, at least every CHECKPOINT_SECONDS, less often where a save is
long, and after its last step when asked."""

from dpdistill.training.state import CHECKPOINT_SECONDS, SAVE_SHARE, Checkpoints


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_saves_at_its_step_count_and_whenever_the_seconds_have_passed():
    clock, saved = FakeClock(), []
    checkpoints = Checkpoints(every=100, clock=clock)
    for step in range(1, 301):  # a step of 1 s: a save every 30 s, however far the step count's next one is
        clock.now = float(step)
        checkpoints(step, lambda: saved.append(step))
    assert saved == [30, 60, 90, 100, 130, 160, 190, 200, 230, 260, 290, 300]


def test_a_loop_without_a_step_count_saves_on_time_and_after_its_last_step_when_asked():
    clock, saved = FakeClock(), []
    checkpoints = Checkpoints(clock=clock)
    for step in range(1, 11):
        clock.now = 7.0 * step
        checkpoints(step, lambda: saved.append(step), final=step == 10)
    assert saved == [5, 10]  # 35 s, then the last step's
    assert CHECKPOINT_SECONDS == 30.0


def test_a_long_save_is_repeated_only_when_it_costs_at_most_its_share_of_the_time():
    clock, saved = FakeClock(), []

    def slow_save() -> None:  # a 2 GB state: 6 s to write
        saved.append(clock.now)
        clock.now += 6.0

    checkpoints = Checkpoints(clock=clock)
    for step in range(1, 200):
        clock.now += 1.0
        checkpoints(step, slow_save)
    gaps = [later - earlier for earlier, later in zip(saved, saved[1:])]
    assert saved[0] == 30.0 and all(gap == 6.0 / SAVE_SHARE + 6.0 for gap in gaps)  # 60 s waited after each
