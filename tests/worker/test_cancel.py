"""Cancel (``api.cancel``): a pending message is deleted with a record of who and why; a
running one is asked to stop, and its receiver sees it through ``MessageContext.cancelled``
(cooperative); its time limit stays the hard stop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from spanner_queues import api
from spanner_queues.controls import MessageCancellation
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import Cancelled, MessageAlreadyAcked, TimeLimitExceeded
from spanner_queues.failures import key_text
from spanner_queues.receivers import MessageContext, ReceiverRegistry, receiver
from spanner_queues.worker import Worker, WorkerEvents
from tests.worker.conftest import running
from tests.workerapp.models import WorkItemsDead

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


def _leases_known() -> bool:
    """The engine keeps lease bookkeeping (the table engine): a leased message is told apart
    from a pending one (native Spanner queues keep none: the cancel deletes it)."""
    return engine_for(WorkItemsDead).features.supports_lease_checked_ack


def test_cancelling_a_pending_message_deletes_it_with_a_record_of_who_and_why() -> None:
    sent = WorkItemsDead.send(id="a", payload={"n": 1})
    WorkItemsDead.send(id="b")
    record = api.cancel(WorkItemsDead, sent, reason="sent by mistake", by="alice")
    assert not record.running
    assert list(WorkItemsDead.objects.values_list("id", flat=True)) == ["b"]
    row = MessageCancellation.objects.using(engine_for(WorkItemsDead).database).get()
    assert (row.queue, row.message_key, row.reason, row.by) == (
        "workerapp.WorkItemsDead",
        key_text(("a",)),
        "sent by mistake",
        "alice",
    )
    assert row.cancelled_at is not None


def test_cancelling_a_message_that_is_gone_raises_and_records_nothing() -> None:
    with pytest.raises(MessageAlreadyAcked):
        api.cancel(WorkItemsDead, ("nope",), reason="x")
    assert not MessageCancellation.objects.using(engine_for(WorkItemsDead).database).exists()


def _looping_receiver(
    registry: ReceiverRegistry, started: threading.Event, *, checks: Callable[[int], bool]
) -> None:
    """A receiver that loops; it checks ``context`` when ``checks(attempt)``, else it spins
    (ignoring any cancel) until its time limit. Not atomic: on SQLite an atomic receiver's
    transaction holds the database's one write lock, and the cancel would wait for its end."""

    # (its time limit leaves a loaded machine time for the first check: a run is asked once
    # it has lasted CANCEL_CHECK_SECONDS)
    @receiver(WorkItemsDead, takes_context=True, registry=registry, timeout=4.0, atomic=False)
    def loop(context: MessageContext, message: Any) -> None:
        started.set()
        check = checks(context.attempt or 1)
        while True:
            if check:
                context.raise_if_cancelled()
            threading.Event().wait(0.01)


def test_a_cancelled_running_receiver_stops_at_its_next_check(
    make_worker: MakeWorker, events: WorkerEvents
) -> None:
    registry = ReceiverRegistry()
    started = threading.Event()
    _looping_receiver(registry, started, checks=lambda attempt: True)
    sent = WorkItemsDead.send(id="a")
    with running(make_worker(WorkItemsDead, registry=registry)) as worker:
        assert started.wait(30)
        record = api.cancel(WorkItemsDead, sent, reason="customer left", by="bob")
        assert record.running is _leases_known()
        assert events.wait_for("cancelled", timeout=30)
    [event] = [e for e in events.history if e.name == "cancelled"]
    assert isinstance(event.error, Cancelled)
    assert (event.error.reason, event.error.by) == ("customer left", "bob")
    assert events.counts["cancel_requested"] == 1
    assert (worker.stats.cancelled, worker.stats.failed, worker.stats.retried) == (1, 0, 0), [
        (e.name, e.error) for e in events.history
    ]
    # acked, not retried
    assert not WorkItemsDead.objects.exists()


def test_a_receiver_that_ignores_a_cancel_is_stopped_by_its_time_limit(
    make_worker: MakeWorker, events: WorkerEvents
) -> None:
    """The first run never looks: its time limit interrupts it, a failed attempt as ever. The
    cancel stays in force for the message: its next run, which looks, stops on it."""
    registry = ReceiverRegistry()
    started = threading.Event()
    _looping_receiver(registry, started, checks=lambda attempt: attempt > 1)
    sent = WorkItemsDead.send(id="a")
    with running(make_worker(WorkItemsDead, registry=registry)):
        assert started.wait(30)
        api.cancel(WorkItemsDead, sent, reason="stop", by="carol")
        assert events.wait_for("failed", timeout=30)
        [failed] = [e for e in events.history if e.name == "failed"]
        assert isinstance(failed.error, TimeLimitExceeded)
        if _leases_known():  # (native: the cancel deleted it; nothing runs again)
            assert events.wait_for("cancelled", timeout=30)
    assert not WorkItemsDead.objects.exists()


def test_a_cancel_does_not_apply_to_a_message_sent_again_under_its_key(
    make_worker: MakeWorker, events: WorkerEvents
) -> None:
    WorkItemsDead.send(id="a")
    api.cancel(WorkItemsDead, ("a",), reason="the old one")
    registry = ReceiverRegistry()
    seen: list[bool] = []

    @receiver(WorkItemsDead, takes_context=True, registry=registry, atomic=False)
    def look(context: MessageContext, message: Any) -> None:
        # the worker reads the cancellations of what it runs within CANCEL_CHECK_SECONDS
        events.wait_for("cancel_requested", timeout=2.5)
        seen.append(context.cancelled)

    WorkItemsDead.send(id="a")
    with running(make_worker(WorkItemsDead, registry=registry)):
        assert events.wait_for("acked", timeout=30)
    assert seen == [False]


def test_cancellation_records_past_their_keep_days_are_pruned_by_a_cancel_once_an_hour(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The records stay bounded by a month of cancels: ``api.cancel`` deletes the ones made
    more than ``CANCELLATION_KEEP_DAYS`` ago, at most once an hour per process and database."""
    from datetime import timedelta

    from spanner_queues import clock, controls

    monkeypatch.setattr(controls, "_prunes", clock.Throttle())
    db = engine_for(WorkItemsDead).database
    records = MessageCancellation.objects.using(db)
    now = clock.now()
    keep = timedelta(days=controls.CANCELLATION_KEEP_DAYS)

    def record(key: str, age: timedelta) -> None:
        records.create(queue="workerapp.WorkItemsDead", message_key=key, cancelled_at=now - age)

    record("old-1", keep + timedelta(days=1))
    record("old-2", keep + timedelta(hours=1))
    record("recent", keep - timedelta(days=1))
    WorkItemsDead.send(id="a")
    api.cancel(WorkItemsDead, ("a",), reason="no longer needed")
    kept = set(records.values_list("message_key", flat=True))
    assert kept == {"recent", key_text(("a",))}

    record("old-3", keep + timedelta(days=2))  # within the hour: left for the next prune
    WorkItemsDead.send(id="b")
    api.cancel(WorkItemsDead, ("b",), reason="no longer needed")
    assert "old-3" in set(records.values_list("message_key", flat=True))
