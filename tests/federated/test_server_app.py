"""The deployed ServerApp's grid hands each stage's replies over as they land, not on Flower's 3-second clock, and
still gives up on a silent owner at the stage's timeout; the journal says when the ServerApp has returned."""

from types import SimpleNamespace

import pytest

from dpdistill.federated import server_app
from dpdistill.federated.server_app import PromptGrid, RoundJournal


class Clock:
    """The grid's clock, read and slept on without waiting: each sleep moves it on by exactly its length."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        assert self.now < 60, "still waiting after a minute: the timeout was not kept"


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(server_app, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))
    return clock


class SlowOwners:
    """Replies that land `delays` seconds after the messages are pushed (None: never)."""

    def __init__(self, clock: Clock, delays: dict[str, float | None]) -> None:
        self.clock, self.delays, self.pushed, self.pulls = clock, delays, 0.0, 0

    def push_messages(self, messages):
        self.pushed = self.clock.now
        return list(self.delays)

    def pull_messages(self, message_ids):
        self.pulls += 1
        elapsed = self.clock.now - self.pushed
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=name)) for name in message_ids
                if self.delays[name] is not None and self.delays[name] <= elapsed + 1e-9]


def replied(replies) -> list[str]:
    return sorted(reply.metadata.reply_to_message_id for reply in replies)


def test_replies_are_collected_as_they_land(clock: Clock):
    owners = SlowOwners(clock, {"a": 0.0, "b": 0.3})
    assert replied(PromptGrid(owners).send_and_receive([], timeout=30)) == ["a", "b"]
    # the pull after the last reply lands, at the next tenth of a second: Flower's deployed grid waits 3 s
    assert clock.now == pytest.approx(0.3) and owners.pulls == 4


def test_a_silent_owner_is_left_out_at_the_timeout(clock: Clock):
    owners = SlowOwners(clock, {"a": 0.1, "lost": None})
    assert replied(PromptGrid(owners).send_and_receive([], timeout=0.5)) == ["a"]
    assert 0.5 <= clock.now < 0.5 + PromptGrid.PULL_SECONDS + 1e-9  # given up at the first pull past the timeout


def test_the_journal_says_when_the_server_app_returned(tmp_path):
    journal = RoundJournal(tmp_path / "rounds")
    assert not journal.ended()
    journal.end()
    assert journal.ended()
    journal.clear_end()  # a resumed run's deployment clears it before it submits the run
    assert not journal.ended()
