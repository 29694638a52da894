"""*decide* (``worker.decide``) as a table: one outcome, its queue's options, the attempt and
the back-off in; one settlement out. No database, no threads, no clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

import pytest

from spanner_queues.exceptions import (
    Cancelled,
    LeaseLost,
    MessageAlreadyAcked,
    Retry,
    TimeLimitExceeded,
)
from spanner_queues.options import QueueOptions
from spanner_queues.receivers import NoReceiver
from spanner_queues.worker.decide import PARKED_UNTIL, Action, Settlement, decide, park
from spanner_queues.worker.outcomes import Kind, Outcome

NOW = datetime(2026, 1, 1, tzinfo=dt_timezone.utc)
BACKOFF = timedelta(seconds=30)
PLAIN = QueueOptions()
THREE = QueueOptions(max_attempts=3)
DEAD = QueueOptions(max_attempts=3, dead_letter_queue="app.Dead")
DROP = QueueOptions(max_attempts=3, discard_after_max_attempts=True)
FAIL = RuntimeError("boom")
NO_DELIVERY: Any = None  # decide never reads the delivery: it is the storage's, not the policy's


def outcome(kind: Kind, error: BaseException | None = None, *, acked: bool = False) -> Outcome:
    return Outcome(kind, NO_DELIVERY, "r", 0.1, error, None, acked)


TABLE = [
    # (name, outcome, options, attempt, lease held, settlement)
    ("acked", outcome(Kind.ACKED), PLAIN, 1, True, Settlement(Action.ACKED, "acked")),
    ("retry after its own delay", outcome(Kind.RETRY, Retry(after=timedelta(seconds=5))),
     PLAIN, 1, True, Settlement(Action.REQUEUE, "retried", due=NOW + timedelta(seconds=5))),
    ("retry after the back-off", outcome(Kind.RETRY, Retry()), THREE, 3, True,
     Settlement(Action.REQUEUE, "retried", due=NOW + BACKOFF)),
    ("failed, attempts left", outcome(Kind.FAILED, FAIL), THREE, 2, True,
     Settlement(Action.RELEASE, "released", due=NOW + BACKOFF)),
    ("failed, no limit", outcome(Kind.FAILED, FAIL), PLAIN, 99, True,
     Settlement(Action.RELEASE, "released", due=NOW + BACKOFF)),
    ("failed last attempt, dead letter", outcome(Kind.FAILED, FAIL), DEAD, 3, True,
     Settlement(Action.DEAD_LETTER, "dead_lettered", attempt=3)),
    ("failed last attempt, discard", outcome(Kind.FAILED, FAIL), DROP, 3, True,
     Settlement(Action.DISCARD, "discarded", attempt=3)),
    ("failed last attempt, neither", outcome(Kind.FAILED, FAIL), THREE, 3, True,
     Settlement(Action.RELEASE, "released", due=NOW + BACKOFF, attempt=3)),
    ("timed out on its last attempt", outcome(Kind.TIMED_OUT, TimeLimitExceeded()), DEAD, 3,
     True, Settlement(Action.DEAD_LETTER, "dead_lettered", attempt=3)),
    ("stuck, attempts left", outcome(Kind.STUCK, FAIL), DEAD, 1, True,
     Settlement(Action.RELEASE, "released", due=NOW + BACKOFF)),
    ("failed, acked by its receiver", outcome(Kind.FAILED, FAIL, acked=True), DEAD, 3, True,
     Settlement(Action.NOTHING, "failed")),
    ("failed, lease lost", outcome(Kind.FAILED, FAIL), DEAD, 3, False,
     Settlement(Action.NOTHING, "lease_lost")),
    ("retry, lease lost", outcome(Kind.RETRY, Retry()), PLAIN, 1, False,
     Settlement(Action.NOTHING, "lease_lost")),
    ("lease lost", outcome(Kind.LEASE_LOST, LeaseLost()), DEAD, 3, True,
     Settlement(Action.NOTHING, "lease_lost")),
    ("already acked", outcome(Kind.ALREADY_ACKED, MessageAlreadyAcked()), DEAD, 3, True,
     Settlement(Action.NOTHING, "already_acked")),
    ("unmatched, even past max_attempts", outcome(Kind.UNMATCHED, NoReceiver("x")), DEAD, 9,
     True, Settlement(Action.REQUEUE, "unmatched", due=NOW + BACKOFF)),
    ("exhausted, dead letter", outcome(Kind.EXHAUSTED), DEAD, 4, True,
     Settlement(Action.DEAD_LETTER, "dead_lettered", attempt=4)),
    ("exhausted, discard", outcome(Kind.EXHAUSTED), DROP, 4, True,
     Settlement(Action.DISCARD, "discarded", attempt=4)),
    ("exhausted, neither", outcome(Kind.EXHAUSTED), THREE, 4, True,
     Settlement(Action.RELEASE, "released", due=NOW + BACKOFF, attempt=4)),
    ("cancelled, even with attempts left", outcome(Kind.CANCELLED, Cancelled("typo")), DEAD, 1,
     True, Settlement(Action.DISCARD, "cancelled")),
    ("cancelled, acked by its receiver", outcome(Kind.CANCELLED, Cancelled("x"), acked=True),
     DEAD, 1, True, Settlement(Action.NOTHING, "cancelled")),
    ("cancelled, lease lost", outcome(Kind.CANCELLED, Cancelled("typo")), DEAD, 1, False,
     Settlement(Action.NOTHING, "lease_lost")),
]  # fmt: skip


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("outcome", "options", "attempt", "held", "settled"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_decide_settles_each_outcome_as_its_storage_action(
    outcome: Outcome, options: QueueOptions, attempt: int, held: bool, settled: Settlement
) -> None:
    got = decide(outcome, options, now=NOW, backoff=BACKOFF, attempt=attempt, lease_held=held)
    assert got == settled


@pytest.mark.engine_independent
def test_a_key_that_clashes_in_the_dead_letter_queue_is_parked() -> None:
    assert park() == Settlement(Action.PARK, "dead_letter_clash", due=PARKED_UNTIL)


@pytest.mark.engine_independent
def test_every_action_is_a_row_of_the_table() -> None:
    assert {row[-1].action for row in TABLE} | {park().action} == set(Action)
