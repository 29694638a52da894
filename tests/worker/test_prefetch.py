"""Prefetch (``Worker(prefetch=N)``) and the driver's write lock around the transactions
spanner_queues opens itself. Tests wait on worker events; no timing assertions."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues import transactions as sq_transactions
from spanner_queues.drivers import driver_for
from spanner_queues.transactions import run_in_transaction
from spanner_queues.worker import Worker, WorkerEvents
from tests.worker.conftest import require, running, watch_receives
from tests.workerapp.models import WorkItems, WorkLog

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


def _count_receives(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the batches the worker received."""
    sizes: list[int] = []
    watch_receives(monkeypatch, lambda kwargs, got: sizes.append(len(got)), WorkItems)
    return sizes


def test_prefetch_processes_every_message_once(
    make_worker: MakeWorker, events: WorkerEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _count_receives(monkeypatch)
    sent = WorkItems.send_many([{"payload": {}} for _ in range(40)])
    stats = make_worker(WorkItems, burst=True, concurrency=1, prefetch=10).run()
    assert stats.processed == 40 and stats.received == 40 and stats.failed == 0
    logged = list(WorkLog.objects.values_list("key", flat=True))
    assert sorted(logged) == sorted(m.key[0] for m in sent)  # each once
    assert not WorkItems.objects.exists()
    assert sizes[0] == 10  # one claim for ten messages, each then acked on its own
    assert events.counts["acked"] == 40 and events.counts["returned"] == 0


def test_prefetch_with_threads_processes_every_message_once(make_worker: MakeWorker) -> None:
    sent = WorkItems.send_many([{"payload": {}} for _ in range(60)])
    stats = make_worker(WorkItems, burst=True, concurrency=3, prefetch=4).run()
    assert stats.processed == 60
    logged = list(WorkLog.objects.values_list("key", flat=True))
    assert sorted(logged) == sorted(m.key[0] for m in sent)
    assert not WorkItems.objects.exists()


def test_prefetch_holds_at_most_concurrency_times_prefetch(
    make_worker: MakeWorker, events: WorkerEvents, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    WorkItems.send_many([{"payload": {"block": str(go), "mode": "external"}} for _ in range(9)])
    with running(make_worker(WorkItems, concurrency=1, prefetch=4)):
        assert events.wait_for("started")
        assert events.counts["received"] == 4  # one running, three waiting: no more claimed
        go.touch()
        assert events.wait_for("acked", 9)
    assert not WorkItems.objects.exists()


def test_max_messages_finishes_prefetched_messages(make_worker: MakeWorker) -> None:
    WorkItems.send_many([{"payload": {}} for _ in range(10)])
    stats = make_worker(WorkItems, prefetch=4, max_messages=6).run()
    assert stats.received == 6 and stats.processed == 6 and stats.returned == 0
    assert WorkItems.objects.count() == 4


def test_stop_releases_prefetched_messages_not_started(
    make_worker: MakeWorker, events: WorkerEvents, tmp_path: Path
) -> None:
    require("supports_release")
    go = tmp_path / "go"
    sent = WorkItems.send_many(
        [{"id": f"m{i}", "payload": {"block": str(go), "mode": "external"}} for i in range(5)]
    )
    worker = make_worker(WorkItems, concurrency=1, prefetch=5)
    with running(worker):
        assert events.wait_for("started")
        assert events.counts["received"] == 5
        worker.stop()
        go.touch()
    first = events.messages("started")[0]
    assert events.counts["started"] == 1 and events.messages("acked")[0].key == first.key
    assert worker.stats.returned == 4 and events.counts["returned"] == 4
    returned = {m.key for m in events.messages("returned")}
    assert returned == {m.key for m in sent} - {first.key}
    # given back due now, without spending an attempt: anyone can receive them at once, and
    # it is their first delivery again
    again = api.receive(WorkItems, max_messages=10)
    assert {m.key for m in again} == returned
    assert {m.attempt for m in again} == {1}


def _stop_before_start(worker: Worker, claim: int) -> None:
    """What run() does when stop() comes between a claim and an executor taking the messages:
    claim into the buffer, stop, then let one executor drain the buffer."""
    assert worker.intake.fill(worker.plans[0], claim) >= 1
    worker.stop()
    worker.units.put(None)
    executor = threading.Thread(target=worker._execute_units)
    executor.start()
    executor.join(60)
    assert not executor.is_alive()


def test_graceful_stops_do_not_spend_attempts_of_unstarted_messages(
    make_worker: MakeWorker,
) -> None:
    require("supports_attempt_count")
    sent = WorkItems.send(id="never-ran", payload={})
    for _ in range(4):  # more stops than WorkItems' max_attempts
        worker = make_worker(WorkItems, concurrency=1, prefetch=2)
        _stop_before_start(worker, 2)
        assert worker.stats.returned == 1 and worker.stats.processed == 0
    stats = make_worker(WorkItems, burst=True).run()
    assert stats.processed == 1 and stats.dead_lettered == 0
    assert list(WorkLog.objects.values_list("key", "attempt")) == [(sent.key[0], 1)]


def test_at_stop_an_unstarted_message_that_failed_before_is_run(make_worker: MakeWorker) -> None:
    require("supports_attempt_count")
    require("supports_release")
    sent = WorkItems.send(id="failed-once", payload={})
    (first,) = api.receive(WorkItems)
    api.release(first)  # as after a failure: its first attempt is spent
    worker = make_worker(WorkItems, concurrency=1, prefetch=2)
    _stop_before_start(worker, 2)
    assert worker.stats.returned == 0 and worker.stats.processed == 1
    assert list(WorkLog.objects.values_list("key", "attempt")) == [(sent.key[0], 2)]


def test_prefetched_message_whose_lease_was_lost_is_not_run(
    make_worker: MakeWorker, events: WorkerEvents, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("supports_lease_renewal")
    monkeypatch.setattr(api, "renew_many", lambda messages: [])  # every renewal loses
    go = tmp_path / "go"
    WorkItems.send_many(
        [{"id": f"m{i}", "payload": {"block": str(go), "mode": "external"}} for i in range(2)]
    )
    with running(make_worker(WorkItems, concurrency=1, prefetch=2, lease=timedelta(seconds=0.4))):
        assert events.wait_for("renewal_failed", 2)
        go.touch()
        assert events.wait_for("lease_lost", 2)
    assert events.counts["started"] == 1  # the waiting one was never run
    assert events.counts["acked"] == 0 and WorkItems.objects.count() == 2
    started = events.messages("started")[0].key[0]  # (an external receiver: its write stays)
    assert list(WorkLog.objects.values_list("key", flat=True)) == [started]


def test_prefetch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="prefetch"):
        Worker(["workerapp.WorkItems"], prefetch=0, install_signal_handlers=False)


# --- the driver's write lock --------------------------------------------------------------


def _record_write_locks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    entered: list[str] = []

    class Recording:
        def __init__(self, driver: Any) -> None:
            self.driver = driver

        def __getattr__(self, name: str) -> Any:
            return getattr(self.driver, name)

        @contextlib.contextmanager
        def write_lock(self) -> Iterator[None]:
            entered.append(threading.current_thread().name)
            with self.driver.write_lock():
                yield

    monkeypatch.setattr(sq_transactions, "driver_for", lambda alias: Recording(driver_for(alias)))
    return entered


def test_write_lock_only_around_transactions_spanner_queues_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered = _record_write_locks(monkeypatch)
    nested = []
    # outermost: taken once; a nested run_in_transaction runs in it and takes nothing more
    run_in_transaction(
        lambda: nested.append(run_in_transaction(lambda: 1, using="default")), using="default"
    )
    assert len(entered) == 1 and nested == [1]
    entered.clear()
    with transaction.atomic():  # a caller's own block: never wrapped
        WorkItems.send(payload={})
        run_in_transaction(lambda: api.receive(WorkItems), using="default")
    assert entered == []


def test_write_lock_is_reentrant_and_shared_by_threads() -> None:
    lock = driver_for("default")
    with lock.write_lock(), lock.write_lock():  # re-entrant in one thread
        pass
    done = []

    def other() -> None:
        with driver_for("default").write_lock():
            done.append(True)

    threads = [threading.Thread(target=other) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert done == [True] * 4


def test_receivers_calling_the_api_under_threads_do_not_deadlock(make_worker: MakeWorker) -> None:
    # Receivers that send (resend_later) and write in the ack transaction, on 4 threads.
    from tests.workerapp.models import Events

    Events.send_many([{"payload": {"type": "resend", "times": 2}} for _ in range(12)])
    stats = make_worker(Events, burst=True, concurrency=4, prefetch=3).run()
    assert stats.processed == 36 and not Events.objects.exists()
    assert WorkLog.objects.filter(note="other:resend").count() == 12
