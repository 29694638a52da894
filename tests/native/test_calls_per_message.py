"""Spanner calls per message of a worker draining a backlog, counted at the gRPC client
(``tests.native.grpc_calls``; session management left out), with receivers that write one row
in their transaction, as ``benchmarks/native_round_trips.py --workloads writing`` measures
them (docs/benchmarks.md). The floor of a message run alone (``group_size=1``) is the
receiver's write, the ack and the commit: 3 per run; in a group (the worker's group commit) the
group's acks are one statement and it commits once, so the floor is the write, 1 a message.
The emulator aborts transactions real Spanner would not (it runs one read-write
transaction at a time, and the front's RECEIVE claims are transactions), and the DB-API replays
an aborted one, sending its write and its ack again: those replays (the writes beyond one per
run of the receiver) are not counted against the bound. Under a backlog RECEIVE is asked in
probes of a whole batch (``RECEIVE_BATCH_SIZE``) and a batch receiver is handed its whole
batch, so RECEIVE's share stays small."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import transaction

from spanner_queues import api, controls
from spanner_queues.controls import MessageCancellation, PausedQueue
from spanner_queues.engines import engines
from spanner_queues.receivers import ReceiverRegistry, receiver
from spanner_queues.worker import Worker
from spanner_queues.worker.events import WorkerEvents
from tests.native.grpc_calls import counting
from tests.testapp.models import Account, Jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _fill(count: int) -> None:
    specs = [{"id": f"c{i}", "payload": b"x"} for i in range(count)]
    for start in range(0, count, 400):
        with transaction.atomic():
            api.send_many(Jobs, specs[start : start + 400])


def _drain(registry: ReceiverRegistry, count: int, *, burst: bool, **options: Any) -> Any:
    """Drain ``count`` messages; a long-running worker is stopped (as SIGTERM stops it) once
    every message was acked. Returns the call counter (the worker's counters as its
    ``stats``)."""
    events = WorkerEvents()
    worker = Worker(
        [Jobs],
        registry=registry,
        burst=burst,
        install_signal_handlers=False,
        summary_interval=None,
        listeners=[events],
        **options,
    )

    def stop_when_drained() -> None:
        events.wait_for("acked", count, timeout=120)
        worker.stop()

    with counting() as counter:
        stopper = threading.Thread(target=stop_when_drained, daemon=True)
        stopper.start()
        started = time.monotonic()
        try:
            worker.run()
        finally:
            worker.stop()
            stopper.join(10)
        counter.seconds = time.monotonic() - started
        engines["default"].stop_receiving(wait=30)
    assert events.counts["acked"] == count
    counter.stats = worker.stats
    return counter


#: the reads a worker makes per second, not per message: which queues are paused (the pause
#: watcher) and which running messages were cancelled (the renewer, for runs of a second or
#: more): on the emulator, whose calls take tens of milliseconds, a drain lasts seconds and a
#: loaded machine stretches it, so they are bounded by the drain's length, not counted per message
POLLS = (
    f"SELECT FROM {PausedQueue._meta.db_table}",
    f"SELECT FROM {MessageCancellation._meta.db_table}",
)


def _polls(counter: Any) -> int:
    """The per-second reads of the drain, asserted bounded by its length; returns them."""
    statements = counter.statements()
    polls = sum(statements[kind] for kind in POLLS)
    per_second = 1 / controls.PAUSE_CHECK_SECONDS + 1 / controls.CANCEL_CHECK_SECONDS
    assert polls <= counter.seconds * per_second + 4, (polls, counter.seconds, statements)
    return polls


def _per_message(counter: Any, runs: int, count: int) -> float:
    """Calls per message, less the emulator's replays of aborted transactions (each re-sends
    the receiver's write and the ack)."""
    replays = max(0, counter.statements()[f"INSERT INTO {Account._meta.db_table}"] - runs)
    return (counter.total() - 2 * replays) / count


@pytest.mark.parametrize("burst", [False, True], ids=["long-running", "burst"])
def test_a_single_message_receiver_run_alone_costs_at_most_3_3_calls_per_message(
    burst: bool,
) -> None:
    count = 40
    runs: list[int] = []
    registry = ReceiverRegistry()

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        Account.objects.create(name="done")
        runs.append(1)

    _fill(count)
    counter = _drain(registry, count, burst=burst, group_size=1)
    calls = _per_message(counter, len(runs), count)
    assert calls <= 3.3, (calls, counter.work_calls(), counter.statements())


@pytest.mark.parametrize("burst", [False, True], ids=["long-running", "burst"])
def test_a_batch_receiver_of_20_runs_a_backlog_in_whole_batches_at_most_0_35_calls_each(
    burst: bool,
) -> None:
    count = 200
    runs: list[int] = []
    registry = ReceiverRegistry()

    @receiver(Jobs, registry=registry, batch=True, max_batch_size=20)
    def write(messages: Any) -> None:
        Account.objects.create(name=f"done {len(messages)}")
        runs.append(len(messages))

    _fill(count)
    counter = _drain(registry, count, burst=burst)
    assert runs.count(20) >= 8, runs  # (RECEIVE batches are 10: one run per two of them)
    calls = _per_message(counter, len(runs), count)
    assert calls <= 0.35, (calls, counter.work_calls(), counter.statements())


@pytest.mark.parametrize("burst", [False, True], ids=["long-running", "burst"])
def test_a_single_message_receiver_in_groups_costs_at_most_1_3_calls_per_message(
    burst: bool,
) -> None:
    """Group commit: one transaction runs many messages' receivers (the default group size)
    and their acks are one DELETE riding its commit; the receiver's own write is the floor, 1
    a message. (The emulator's calls take tens of milliseconds where Spanner's take a few:
    groups here close on their size, not on the default 250 ms of receiver time.)
    A group the emulator aborted and the DB-API replayed sent its writes, its
    DELETE and its commit again: those (the writes beyond one per run, the DELETEs and commits
    beyond one per group) are not counted against the bound, nor are the worker's per-second
    reads (``POLLS``: bounded by the drain's length instead)."""
    count = 200
    runs: list[int] = []
    registry = ReceiverRegistry()

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        Account.objects.create(name="done")
        runs.append(1)

    _fill(count)
    counter = _drain(registry, count, burst=burst, group_ms=5000)
    groups = counter.stats.groups
    statements = counter.statements()
    replayed = (
        max(0, statements[f"INSERT INTO {Account._meta.db_table}"] - len(runs))
        + max(0, statements[f"DELETE FROM {Jobs._meta.db_table}"] - groups)
        + max(0, counter.work_calls()["Commit"] - groups)
    )
    calls = (counter.total() - replayed - _polls(counter)) / count
    assert calls <= 1.3, (calls, groups, counter.work_calls(), statements)
