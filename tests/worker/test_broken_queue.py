"""One broken queue of a worker (dropped under it: a deploy, a missing grant, RECEIVE taking time
to reset after re-creation) fails, backs off and recovers alone: the worker's other queues
drain meanwhile, and the failure shows in ``queue_health()``, the events, the summary and the
logs (one line per failure episode). Runs on every engine: a real queue (or table) is dropped
under a running worker and created again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from spanner_queues.engines import engines
from spanner_queues.exceptions import BurstFailed
from spanner_queues.options import queue_options
from spanner_queues.worker import Worker, WorkerEvents, intake
from spanner_queues.worker.intake import QUEUE_BACKOFF_MAX
from tests.conftest import wait_until
from tests.worker.conftest import running
from tests.workerapp.models import Tasks, WorkItems, WorkLog

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


@contextmanager
def dropped(model: type) -> Iterator[None]:
    """``model``'s queue dropped for the block, created again (empty) at its end."""
    engine = engines["default"]
    with connection.schema_editor() as editor:
        engine.drop_queue(editor, model, queue_options(model))
    try:
        yield
    finally:
        with connection.schema_editor() as editor:
            engine.create_queue(editor, model, queue_options(model))


def test_a_dropped_queue_backs_off_alone_and_recovers_when_created_again(
    make_worker: MakeWorker, events: WorkerEvents, caplog: pytest.LogCaptureFixture
) -> None:
    # The broken queue first: a worker that restarted each round at the queue that raised
    # never asked the other one.
    worker = make_worker(Tasks, WorkItems, summary_interval=0.05)
    caplog.set_level(logging.DEBUG, logger="spanner_queues.worker")
    with running(worker):
        with dropped(Tasks):
            assert events.wait_for("receive_failed", timeout=60)
            sent = WorkItems.send_many([{"payload": {}} for _ in range(5)])
            assert events.wait_for("acked", 5, timeout=90), events.counts
            assert sorted(WorkLog.objects.values_list("key", flat=True)) == sorted(
                m.key[0] for m in sent
            )
            wait_until(lambda: events.counts["receive_failed"] >= 3, timeout=60)
            health = worker.queue_health()
            assert health["workerapp.Tasks"].failing
            assert not health["workerapp.WorkItems"].failing
            assert events.wait_for("summary", events.counts["summary"] + 1)
            summaries = [e for e in events.history if e.name == "summary"]
            assert summaries[-1].stats is not None and summaries[-1].stats.receive_errors >= 3
        # created again: the broken queue recovers by itself
        Tasks.send(kind="email", id="after")
        assert events.wait_for("queue_recovered", timeout=90)
        wait_until(lambda: WorkLog.objects.filter(key="after").exists(), timeout=90)
        assert not worker.queue_health()["workerapp.Tasks"].failing
    failing = [e.queue for e in events.history if e.name == "receive_failed"]
    assert set(failing) == {"workerapp.Tasks"}
    # one warning for the whole episode, however many receives failed; one line when it ends
    warnings = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and getattr(r, "action", "") == "queue_failing"
    ]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].queue == "workerapp.Tasks"  # type: ignore[attr-defined]
    recovered = [r for r in caplog.records if getattr(r, "action", "") == "queue_recovered"]
    assert len(recovered) == 1 and "workerapp.Tasks" in recovered[0].getMessage()


def test_a_queue_failing_for_hours_keeps_backing_off_at_the_cap(make_worker: MakeWorker) -> None:
    # The back-off doubled per failure in a row as a float times 2**failures: the 1,024th
    # failure (about 75 minutes of a dropped queue at the 5 s cap) raised OverflowError out of
    # the intake loop and stopped the worker.
    worker = make_worker(Tasks, WorkItems)
    health = worker.queue_health()["workerapp.Tasks"]
    for _ in range(1100):
        worker.intake.queue_failed(health, RuntimeError("queue dropped"))
    assert health.failures == 1100
    assert 0 < health.retry_at - time.monotonic() <= QUEUE_BACKOFF_MAX


def test_a_burst_over_a_queue_that_fails_every_receive_drains_the_others_then_gives_up(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A burst worker waited for a failing queue for ever (``runqueueworker --burst`` against a
    # missing table hung a CI job): now it finishes the other queues' messages, then raises
    # BurstFailed once every receive of the broken one failed for BURST_GIVE_UP_SECONDS.
    monkeypatch.setattr(intake, "BURST_GIVE_UP_SECONDS", 1.0)
    sent = WorkItems.send_many([{"payload": {}} for _ in range(3)])
    worker = make_worker(Tasks, WorkItems, burst=True)
    with dropped(Tasks):
        started = time.monotonic()
        with pytest.raises(BurstFailed, match=r"workerapp\.Tasks"):
            worker.run()
        took = time.monotonic() - started
    assert sorted(WorkLog.objects.values_list("key", flat=True)) == sorted(m.key[0] for m in sent)
    assert worker.stats.processed == 3
    assert 1.0 <= took < 60, took


def test_a_long_running_worker_never_gives_up_on_a_failing_queue(
    make_worker: MakeWorker, events: WorkerEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intake, "BURST_GIVE_UP_SECONDS", 0.2)
    worker = make_worker(Tasks, WorkItems)
    with running(worker), dropped(Tasks):
        health = worker.queue_health()["workerapp.Tasks"]
        wait_until(lambda: health.since is not None, timeout=60)
        wait_until(lambda: time.monotonic() - (health.since or 0) > 0.5, timeout=60)
        failed = events.counts["receive_failed"]  # a round past the burst's limit:
        wait_until(lambda: events.counts["receive_failed"] > failed, timeout=60)
        assert not worker.intake.gave_up and not worker.slots.stopping  # a long run waits
