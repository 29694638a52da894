"""A rolling deploy: a worker of the older release meets a message that only the newer release's
``match=`` receiver takes. No receiver of this process matches it (``NoReceiver``): it is given
back, due after a short back-off, without spending one of its attempts, and the mismatch is
logged once as a WARNING (not an ERROR per delivery)."""

from __future__ import annotations

import itertools
import logging
import time

import pytest

from spanner_queues.engines import engines
from spanner_queues.message import Message
from spanner_queues.worker import WorkerEvent, WorkerEvents, apply
from tests.conftest import wait_until
from tests.worker.conftest import running
from tests.workerapp.models import Jobs, WorkLog

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_message_no_receiver_matches_is_given_back_without_spending_an_attempt(
    make_worker, events: WorkerEvents, caplog: pytest.LogCaptureFixture
) -> None:
    # Jobs: max_attempts 2, discard_after_max_attempts; only kind="email" has a receiver here
    Jobs.send(kind="refund", id="r1")
    Jobs.send(kind="email", id="e1")
    deliveries = 2 * 2 + 1  # well past max_attempts
    caplog.set_level(logging.INFO, logger="spanner_queues")
    with running(make_worker(Jobs)):
        # (or until the message is gone, as it was before: discarded after max_attempts)
        wait_until(
            lambda: (
                sum(1 for m in events.messages("received") if m.key == ("refund", "r1"))
                >= deliveries
                or events.counts["discarded"]
            ),
            timeout=120,
        )
    assert WorkLog.objects.filter(note="job:email").count() == 1
    # still in its queue: neither discarded nor failed, and no attempt spent
    [row] = Jobs.objects.all()
    assert (row.kind, row.id) == ("refund", "r1")
    assert events.counts["failed"] == 0 and events.counts["discarded"] == 0
    assert events.counts["unmatched"] >= deliveries
    if engines["default"].features.supports_attempt_count:
        attempts = [m.attempt for m in events.messages("received") if m.key == ("refund", "r1")]
        assert set(attempts) == {1}
        assert row.attempts == 0
    mismatch = [r for r in caplog.records if getattr(r, "action", None) == "unmatched"]
    assert len(mismatch) == 1, [r.getMessage() for r in mismatch]
    [record] = mismatch
    assert record.levelno == logging.WARNING
    assert "deployment" in record.getMessage() and "kind='refund'" in record.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_each_kind_of_miss_is_logged_once_per_queue(
    make_worker, events: WorkerEvents, caplog: pytest.LogCaptureFixture
) -> None:
    Jobs.send(kind="refund", id="r1")
    Jobs.send(kind="refund", id="r2")
    Jobs.send(kind="invoice", id="i1")
    caplog.set_level(logging.WARNING, logger="spanner_queues")
    with running(make_worker(Jobs)):
        wait_until(
            lambda: events.counts["unmatched"] >= 6 or events.counts["discarded"], timeout=120
        )
    kinds = sorted(
        r.getMessage().split("kind=")[1].split()[0].rstrip(",;:)")
        for r in caplog.records
        if getattr(r, "action", None) == "unmatched"
    )
    assert kinds == ["'invoice'", "'refund'"]
    assert Jobs.objects.count() == 3


def test_the_back_off_of_a_message_no_receiver_matches_grows(
    make_worker, events: WorkerEvents
) -> None:
    # (it came back at the first back-off, 0.2 s here, for ever: its attempts start again at
    # each give-back; now each miss of it in this worker doubles the wait, as failures do)
    Jobs.send(kind="refund", id="r2")
    times: list[float] = []

    def on_event(event: WorkerEvent) -> None:
        if event.name == "received" and event.message and event.message.key == ("refund", "r2"):
            times.append(time.monotonic())

    with running(make_worker(Jobs, listeners=[on_event])):
        wait_until(lambda: len(times) >= 5, timeout=60)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # back-off 0.2 s doubling (tests/settings.py), jittered down by at most 20 %
    assert gaps[3] > 2.5 * gaps[0], gaps
    assert all(b > a for a, b in itertools.pairwise(gaps)), gaps
    assert events.counts["failed"] == 0 and events.counts["discarded"] == 0
    assert Jobs.objects.filter(id="r2").exists()  # nothing burns: still in its queue


@pytest.mark.engine_independent
def test_the_miss_counts_stay_bounded(make_worker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply, "MISSES_REMEMBERED", 3)
    counts = make_worker(Jobs).outcomes

    def miss(n: int) -> int:
        return counts.missed(
            Message(queue="q", key=(n,), key_names=("id",), payload=b"", deliver_time=None)
        )

    assert [miss(1), miss(1), miss(2), miss(3), miss(1)] == [1, 2, 1, 1, 3]
    assert miss(4) == 1 and len(counts.misses) == 3  # 2, the least recent, forgotten
    assert miss(2) == 1
