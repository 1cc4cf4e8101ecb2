"""The deployed ServerApp's grid hands each stage's replies over as they land, not on Flower's 3-second clock, and
still gives up on a silent owner at the stage's timeout; the journal says when the ServerApp has returned."""

import time
from types import SimpleNamespace

from dpdistill.federated.server_app import PromptGrid, RoundJournal


class SlowOwners:
    """Replies that land `delays` seconds after the messages are pushed (None: never)."""

    def __init__(self, delays: dict[str, float | None]) -> None:
        self.delays, self.pushed, self.pulls = delays, 0.0, 0

    def push_messages(self, messages):
        self.pushed = time.monotonic()
        return list(self.delays)

    def pull_messages(self, message_ids):
        self.pulls += 1
        elapsed = time.monotonic() - self.pushed
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=name)) for name in message_ids
                if self.delays[name] is not None and self.delays[name] <= elapsed]


def replied(replies) -> list[str]:
    return sorted(reply.metadata.reply_to_message_id for reply in replies)


def test_replies_are_collected_as_they_land():
    owners = SlowOwners({"a": 0.0, "b": 0.3})
    began = time.monotonic()
    assert replied(PromptGrid(owners).send_and_receive([], timeout=30)) == ["a", "b"]
    assert time.monotonic() - began < 1.0 and owners.pulls >= 2  # Flower's deployed grid: 3 s at the least


def test_a_silent_owner_is_left_out_at_the_timeout():
    began = time.monotonic()
    assert replied(PromptGrid(SlowOwners({"a": 0.1, "lost": None})).send_and_receive([], timeout=0.5)) == ["a"]
    assert 0.5 <= time.monotonic() - began < 1.5


def test_the_journal_says_when_the_server_app_returned(tmp_path):
    journal = RoundJournal(tmp_path / "rounds")
    assert not journal.ended()
    journal.end()
    assert journal.ended()
    journal.clear_end()  # a resumed run's deployment clears it before it submits the run
    assert not journal.ended()
