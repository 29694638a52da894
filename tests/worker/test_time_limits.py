"""Time limits: ``Worker(timeout=...)`` / ``runqueueworker --timeout`` and
``@receiver(timeout=...)``. Past its limit a receiver is interrupted (where Python can), the
delivery counts as a failed attempt and the message goes back to the queue; one that cannot be
interrupted stops the worker with ``WorkerStuck``."""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta

import pytest

import spanner_queues.worker as worker_module
from spanner_queues import receiver
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import InvalidArgument, TimeLimitExceeded, WorkerStuck
from spanner_queues.failures import FailedDelivery
from spanner_queues.receivers import ReceiverConfigurationError, ReceiverRegistry
from spanner_queues.worker import WorkerEvents, limits
from tests.conftest import wait_until
from tests.worker.conftest import running
from tests.workerapp.models import WorkItems, WorkItemsDead, WorkLog
from tests.workerapp.receivers import HANGS

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_receiver_past_its_limit_is_interrupted_and_runs_again(
    make_worker, events: WorkerEvents
) -> None:
    sent = WorkItems.send(payload={"spin_below": 2})
    with running(make_worker(WorkItems, timeout=0.5)):
        assert events.wait_for("acked", timeout=60)
    assert events.counts["timed_out"] == 1 and events.counts["failed"] == 1
    [failure] = [e for e in events.history if e.name == "failed"]
    assert isinstance(failure.error, TimeLimitExceeded)
    # its message names the receiver, the message and the limit
    assert str(failure.error) == (
        f"receiver tests.workerapp.receivers.work ran past its time limit of 0.5 s on "
        f"workerapp.WorkItems(id={sent.key[0]!r}) (attempt 1)"
    )
    # the interrupted run wrote nothing (rolled back); the second attempt did the work
    assert list(WorkLog.objects.values_list("key", "attempt")) == [(sent.key[0], 2)]
    assert not WorkItems.objects.exists()


def test_a_receiver_that_swallows_the_interrupt_is_not_acked(
    make_worker, events: WorkerEvents
) -> None:
    sent = WorkItems.send(payload={"swallow_below": 2})
    with running(make_worker(WorkItems, timeout=0.5)) as worker:
        assert events.wait_for("acked", timeout=60)
    assert worker.stats.timed_out == 1 and worker.stats.failed == 1
    [failure] = [e for e in events.history if e.name == "failed"]
    assert str(failure.error) == (
        f"receiver tests.workerapp.receivers.work ran past its time limit of 0.5 s on "
        f"workerapp.WorkItems(id={sent.key[0]!r}) (attempt 1)"
    )
    assert list(WorkLog.objects.values_list("key", "attempt")) == [(sent.key[0], 2)]


def test_a_receivers_own_limit_applies_without_a_worker_limit(
    make_worker, events: WorkerEvents
) -> None:
    WorkItems.send(payload={"mode": "limited", "spin_below": 2})
    with running(make_worker(WorkItems)):
        assert events.wait_for("acked", timeout=60)
    assert events.counts["timed_out"] == 1
    assert WorkLog.objects.get().note == "limited"


def test_a_receiver_that_cannot_be_interrupted_stops_the_worker(
    make_worker, events: WorkerEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stuck run's failure is recorded on a thread waited for STUCK_RECORD_SECONDS (10 s);
    # on SQLite the stuck atomic receiver holds the write lock, so the wait runs out: 1 s here.
    monkeypatch.setattr(limits, "STUCK_RECORD_SECONDS", 1.0)
    HANGS["stuck"] = hang = __import__("threading").Event()
    WorkItems.send(id="stuck", payload={"hang": "stuck"})
    worker = make_worker(WorkItems, timeout=0.3, concurrency=2)
    worker.time_limits.grace = 0.5
    try:
        with pytest.raises(WorkerStuck, match="could not be interrupted"):
            worker.run()
        assert worker.stats.timed_out == 1
    finally:
        hang.set()  # let the thread go: it rolls back and its message stays queued
    wait_until(lambda: not any(d.stuck and not d.done for d in worker.slots.deliveries))
    assert WorkItems.objects.filter(id="stuck").exists()
    assert not WorkLog.objects.exists()


def test_time_limits_must_be_positive(make_worker) -> None:
    for bad in (0, -1, float("inf"), "5", True):
        with pytest.raises(InvalidArgument, match="timeout must be a positive number"):
            make_worker(WorkItems, timeout=bad)
        with pytest.raises(ReceiverConfigurationError, match="timeout must be a positive"):
            receiver(WorkItems, timeout=bad, registry=ReceiverRegistry())


def test_a_finished_delivery_left_in_the_watch_is_not_taken_for_stuck(make_worker) -> None:
    """An interrupt can land in the context manager's own code before its cleanup runs: the
    watch entry of a thread that left its call then stays. The watchdog drops it once the
    delivery is done instead of stopping the worker as stuck."""
    import threading
    import time

    from spanner_queues.worker.slots import Delivery

    worker = make_worker(WorkItems, timeout=0.1)
    worker.time_limits.grace = 0.1
    stale = Delivery(message=None, plan=worker.plans[0], renew_at=None)  # type: ignore[arg-type]
    stale.deadline, stale.timed_out, stale.done = time.monotonic() - 5, True, True
    worker.time_limits.running_now[12345] = [stale]
    watchdog = threading.Thread(target=worker.time_limits.run, daemon=True)
    watchdog.start()
    wait_until(lambda: 12345 not in worker.time_limits.running_now)
    worker.stop()
    watchdog.join(5)
    assert worker.slots.stuck_units == 0 and not stale.stuck


@pytest.mark.engine_independent
def test_the_interrupt_itself_says_what_happened() -> None:
    # raised as a bare class in the receiver's thread: a receiver that catches it reads this
    assert str(TimeLimitExceeded()) == "the receiver ran past its time limit and was interrupted"


def test_a_run_that_stopped_its_worker_counts_as_a_failed_attempt(
    make_worker, events: WorkerEvents
) -> None:
    # (before: nothing was counted; the message came back first on every restart, stopped
    # that worker too, for ever, and the messages behind it never ran)
    HANGS["stuck-once"] = hang = threading.Event()
    # (not atomic: on SQLite a stuck atomic receiver holds the process's write lock, and the
    # failure is recorded only if it lets go within STUCK_RECORD_SECONDS)
    sent = WorkItems.send(id="stuck-once", payload={"hang": "stuck-once", "mode": "external"})
    worker = make_worker(WorkItems, timeout=0.3)
    worker.time_limits.grace = 0.5
    try:
        with pytest.raises(WorkerStuck):
            worker.run()
        [failure] = [e for e in events.history if e.name == "failed"]
        assert failure.message is not None and failure.message.key == ("stuck-once",)
        assert isinstance(failure.error, WorkerStuck)
        assert "stuck-once" in str(failure.error)  # which message it was
        [row] = WorkItems.objects.filter(id="stuck-once")
        if engine_for(WorkItems).features.supports_release:
            # given back due after its back-off from the stop: the messages behind it run first
            assert sent.deliver_time is not None and row.deliver_time is not None
            assert row.deliver_time > sent.deliver_time + timedelta(seconds=0.8)
        if not engine_for(WorkItems).features.supports_attempt_count:  # the failure ledger
            [recorded] = FailedDelivery.objects.filter(queue="workerapp.WorkItems")
            assert recorded.failures == 1 and "WorkerStuck" in recorded.last_error
    finally:
        hang.set()
    wait_until(lambda: not any(d.stuck and not d.done for d in worker.slots.deliveries))
    assert events.counts["failed"] == 1  # the stuck thread's return is not a second failure


def test_a_run_that_stopped_its_worker_on_its_last_attempt_is_dead_lettered(
    make_worker, events: WorkerEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = worker_module.queue_options  # (the plan's options: what decide reads)
    monkeypatch.setattr(
        worker_module,
        "queue_options",
        lambda m: dataclasses.replace(real(m), max_attempts=1) if m is WorkItems else real(m),
    )
    HANGS["stuck-last"] = hang = threading.Event()
    WorkItems.send(id="stuck-last", payload={"hang": "stuck-last", "mode": "external"})
    worker = make_worker(WorkItems, timeout=0.3)
    worker.time_limits.grace = 0.5
    try:
        with pytest.raises(WorkerStuck):
            worker.run()
        assert events.counts["dead_lettered"] == 1
        assert WorkItemsDead.objects.filter(id="stuck-last").exists()
        assert not WorkItems.objects.filter(id="stuck-last").exists()
    finally:
        hang.set()
    wait_until(lambda: not any(d.stuck and not d.done for d in worker.slots.deliveries))


def test_an_interrupt_inside_a_receivers_own_transaction_rolls_it_back_and_runs_again(
    make_worker, events: WorkerEvents
) -> None:
    # the receiver wrote and acked in its own transaction, which the interrupt rolls back:
    # the message goes back (one failed attempt) and the second attempt does the work, once
    WorkItems.send(
        id="inside", payload={"mode": "external", "own_transaction": True, "spin_inside_below": 2}
    )
    with running(make_worker(WorkItems, timeout=0.5)):
        assert events.wait_for("acked", timeout=60)
    assert events.counts["timed_out"] == 1 and events.counts["failed"] == 1
    assert list(WorkLog.objects.values_list("key", "attempt")) == [("inside", 2)]
    assert not WorkItems.objects.exists()


def test_an_interrupt_after_a_receiver_acked_itself_is_no_failure(
    make_worker, events: WorkerEvents
) -> None:
    # the receiver's own transaction (its work and its ack) committed before the limit: the
    # message is done. It ran past its limit (timed_out, logged) but is not "given back", not
    # counted as failed, and no failure is recorded of a message that no longer exists.
    WorkItems.send(
        id="after", payload={"mode": "external", "own_transaction": True, "spin_after_below": 2}
    )
    with running(make_worker(WorkItems, timeout=0.5)) as worker:
        assert events.wait_for("timed_out", timeout=60)
        assert events.wait_for("acked", timeout=60)
    assert events.counts["failed"] == 0 and worker.stats.failed == 0
    assert not events.messages("lease_lost") and not events.messages("already_acked")
    assert list(WorkLog.objects.values_list("key", "attempt")) == [("after", 1)]
    assert not WorkItems.objects.exists()
    assert not FailedDelivery.objects.exists()
