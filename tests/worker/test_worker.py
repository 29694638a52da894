"""The Worker in-process: ack with the receiver's writes, failures, retries, dead letters,
leases, batches, dispatch, pattern helpers, graceful stop. Tests wait on worker events."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from spanner_queues import api, patterns
from spanner_queues.drivers import driver_for
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import QueueConfigurationError, UnknownQueue
from spanner_queues.failures import FailedDelivery
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.worker import Worker, WorkerEvents
from tests.conftest import wait_until
from tests.worker.conftest import require, running
from tests.workerapp.models import (
    Dirty,
    Events,
    Pings,
    Tasks,
    Ticks,
    WorkItems,
    WorkItemsDead,
    WorkLog,
)

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


def test_burst_drains_and_acks_with_the_receivers_writes(make_worker: MakeWorker) -> None:
    sent = WorkItems.send_many([{"payload": {}} for _ in range(12)])
    stats = make_worker(WorkItems, burst=True, concurrency=3).run()
    assert stats.processed == 12 and stats.failed == 0
    assert sorted(WorkLog.objects.values_list("key", flat=True)) == sorted(m.key[0] for m in sent)
    assert not WorkItems.objects.exists()


def test_failure_rolls_back_logs_and_is_released_with_backoff(
    make_worker: MakeWorker, events: WorkerEvents, caplog: pytest.LogCaptureFixture
) -> None:
    require("supports_release")
    sent = WorkItems.send(payload={"fail_below": 2})
    with (
        caplog.at_level(logging.ERROR, logger="spanner_queues.worker"),
        running(make_worker(WorkItems)),
    ):
        assert events.wait_for("acked")
    assert events.counts["failed"] == 1 and events.counts["released"] == 1
    assert list(WorkLog.objects.values_list("key", "attempt")) == [(sent.key[0], 2)]
    failure = next(r for r in caplog.records if r.levelno == logging.ERROR)
    assert f"workerapp.WorkItems(id='{sent.key[0]}') attempt 1 failed" in failure.getMessage()
    assert failure.queue == "workerapp.WorkItems" and failure.attempt == 1  # type: ignore[attr-defined]


def test_attempt_limit_moves_the_message_to_the_dead_letter_queue(
    make_worker: MakeWorker, events: WorkerEvents
) -> None:
    # Every engine: where deliveries are not counted (native), failed runs are recorded in the
    # transaction that handles each failure (spanner_queues.failures), and Spanner's own
    # redelivery (lease expiry, then back-off) brings the message back.
    sent = WorkItems.send(payload={"fail": True})
    with running(make_worker(WorkItems)):
        assert events.wait_for("dead_lettered", timeout=90)
    assert events.counts["failed"] == 3  # QueueMeta.max_attempts
    assert [m.attempt for m in events.messages("failed")] == [1, 2, 3]
    assert not WorkItems.objects.exists() and not FailedDelivery.objects.exists()
    dead = WorkItemsDead.objects.get(pk=sent.key[0]).as_message()
    assert dead.json() == {"fail": True}
    assert not WorkLog.objects.exists()


def test_discard_after_max_attempts_drops_the_message(
    make_worker: MakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    Pings.send(payload="x")
    with caplog.at_level(logging.ERROR, logger="spanner_queues.worker"):
        stats = make_worker(Pings, burst=True).run()
    assert (stats.failed, stats.discarded) == (1, 1)
    assert not Pings.objects.exists() and not FailedDelivery.objects.exists()
    assert any("discarded" in r.getMessage() for r in caplog.records)


def test_retry_acks_and_resends_not_before_its_time(
    make_worker: MakeWorker, events: WorkerEvents, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    sent = WorkItems.send(payload={"retry_after": 1.0, "trace": str(trace)})
    with running(make_worker(WorkItems)):
        assert events.wait_for("retried")
        assert events.wait_for("acked")
    first, second = (json.loads(line) for line in trace.read_text().splitlines())
    assert first["key"] == second["key"] == list(sent.key)
    assert second["attempt"] == 1  # a fresh message under the same key
    assert second["deliver_time"] >= _plus(first["at"], 1.0)
    assert second["at"] >= second["deliver_time"]
    assert WorkLog.objects.count() == 1


def _plus(iso: str, seconds: float) -> str:
    from datetime import datetime

    return (datetime.fromisoformat(iso) + timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize("mode", ["atomic", "external"])
def test_lost_lease_is_not_acked(
    make_worker: MakeWorker,
    events: WorkerEvents,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    require("supports_lease_renewal")
    if mode == "atomic" and driver_for(engine_for(WorkItems).database).single_writer:
        pytest.skip(
            "one write lock (SQLite): no renewal is written while a receiver's "
            "transaction runs, nor can anyone else take its message"
        )
    monkeypatch.setattr(api, "renew_many", lambda messages: [])  # every renewal loses
    go = tmp_path / "go"
    WorkItems.send(payload={"block": str(go), "mode": mode})
    worker = make_worker(WorkItems, lease=timedelta(seconds=0.4), max_messages=1)
    with running(worker):
        assert events.wait_for("renewal_failed")
        go.touch()
        assert events.wait_for("lease_lost")
    if mode == "atomic":
        assert not WorkLog.objects.exists()  # the receiver's writes rolled back with the ack
    else:  # its work is outside any transaction: done, but the message is not acked
        assert list(WorkLog.objects.values_list("note", flat=True)) == ["external"]
    assert WorkItems.objects.count() == 1
    assert events.counts["acked"] == 0 and events.counts["released"] == 0


def test_renewal_keeps_a_receiver_that_outlives_its_lease(
    make_worker: MakeWorker, events: WorkerEvents
) -> None:
    require("supports_lease_renewal")
    WorkItems.send(payload={"outlive_lease": 1.0, "mode": "external"})
    seen = []
    with running(make_worker(WorkItems, lease=timedelta(seconds=1.5))):
        assert events.wait_for("started")
        while not events.counts["acked"]:  # another receiver never gets it meanwhile
            seen.extend(api.receive(WorkItems))
            events.wait_for("acked", timeout=0.1)
    assert seen == []
    assert events.counts["renewed"] >= 1
    assert list(WorkLog.objects.values_list("attempt", "note")) == [(1, "external")]
    assert not WorkItems.objects.exists()


def test_batch_receiver_gets_batches_acked_together(make_worker: MakeWorker) -> None:
    Dirty.send_many([{"payload": ""} for _ in range(60)])
    stats = make_worker(Dirty, burst=True, concurrency=2, batch_size=40).run()
    assert stats.processed == 60 and not Dirty.objects.exists()
    sizes = list(WorkLog.objects.values_list("attempt", flat=True))
    assert len(sizes) == 60 and max(sizes) <= 25 and max(sizes) > 1  # max_batch_size=25


def test_dispatch_by_key_column_and_payload_field(make_worker: MakeWorker, tmp_path: Path) -> None:
    trace = tmp_path / "webhooks"
    Tasks.send(kind="email", id="e1")
    Tasks.send(kind="report", id="r1")
    Events.send(id="s1", payload={"type": "signup"})
    Events.send(id="w1", payload={"type": "webhook", "trace": str(trace)})
    Events.send(id="o1", payload={"type": "other"})
    stats = make_worker(Tasks, Events, burst=True).run()
    assert stats.processed == 5
    assert dict(WorkLog.objects.values_list("key", "note")) == {
        "e1": "email",
        "r1": "report",
        "s1": "signup",
        "o1": "other:other",
    }
    assert trace.read_text() == "w1\n"  # atomic=False receiver, acked afterwards
    assert not Tasks.objects.exists() and not Events.objects.exists()


def test_resend_later_inside_a_receiver_is_not_acked_twice(
    make_worker: MakeWorker, events: WorkerEvents
) -> None:
    Events.send(id="loop", payload={"type": "resend", "times": 2})
    stats = make_worker(Events, burst=True).run()
    assert stats.processed == 3 and stats.already_acked == 0
    assert list(WorkLog.objects.values_list("note", flat=True)) == ["other:resend"]
    assert not Events.objects.exists()


def test_periodic_schedule_is_seeded_once_and_sends_the_next_run(
    make_worker: MakeWorker,
) -> None:
    with running(make_worker(Ticks)):
        wait_until(lambda: WorkLog.objects.filter(note="tick").count() >= 2)
    [pending] = Ticks.objects.all()
    assert pending.name == "tick" and pending.deliver_time > timezone.now() - timedelta(1)
    assert patterns.seed(Ticks, {"name": "tick"}) is None  # already there: seeded once


def test_heartbeat_replaces_and_cancel_deletes() -> None:
    first = patterns.beat(Ticks, {"name": "worker-1"}, timeout=timedelta(seconds=60))
    second = patterns.beat(Ticks, {"name": "worker-1"}, timeout=timedelta(seconds=90))
    [row] = Ticks.objects.all()
    assert row.deliver_time == second.deliver_time > first.deliver_time
    assert patterns.cancel(Ticks, {"name": "worker-1"}) == 1
    assert patterns.cancel(Ticks, {"name": "worker-1"}) == 0


def test_stop_finishes_in_flight_and_receives_no_more(
    make_worker: MakeWorker, events: WorkerEvents, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    # "a" sends "b" once unblocked, in its transaction: due once the worker is stopping (queues
    # have no order: "b" sent beside "a" could be received first)
    first = WorkItems.send(id="a", payload={"block": str(go), "then_send": "b"})
    worker = make_worker(WorkItems, concurrency=1)
    with running(worker):
        assert events.wait_for("started")
        worker.stop()
        go.touch()
    assert events.messages("acked") and events.messages("acked")[0].key == first.key
    assert list(WorkItems.objects.values_list("id", flat=True)) == ["b"]


def test_never_holds_more_messages_than_free_slots(
    make_worker: MakeWorker, events: WorkerEvents, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    WorkItems.send_many([{"payload": {"block": str(go)}} for _ in range(5)])
    with running(make_worker(WorkItems, concurrency=2, batch_size=10)):
        assert events.wait_for("started", 2)
        assert events.counts["received"] == 2  # both slots busy: nothing more received
        go.touch()
        assert events.wait_for("acked", 5)


def test_max_messages_stops_after_that_many(make_worker: MakeWorker) -> None:
    WorkItems.send_many([{"payload": {}} for _ in range(5)])
    stats = make_worker(WorkItems, max_messages=3).run()
    assert stats.received == 3 and stats.processed == 3
    assert WorkItems.objects.count() == 2


def test_configuration_errors_before_anything_is_received() -> None:
    with pytest.raises(UnknownQueue, match="No queue named"):
        Worker(["workerapp.Nope"], install_signal_handlers=False)
    with pytest.raises(QueueConfigurationError, match="has no receiver"):
        Worker(["testapp.Jobs"], install_signal_handlers=False)
    with pytest.raises(QueueConfigurationError, match="No receivers"):
        Worker(registry=ReceiverRegistry(), install_signal_handlers=False)
    with pytest.raises(CommandError, match="No queue named"):
        call_command("runqueueworker", "workerapp.Nope", "--burst")
    with pytest.raises(CommandError, match="concurrency"):
        call_command("runqueueworker", "--burst", concurrency=0)


def test_a_message_that_failed_then_succeeds_forgets_its_failures(
    make_worker: MakeWorker, events: WorkerEvents
) -> None:
    sent = WorkItems.send(payload={"fail_below": 2})
    with running(make_worker(WorkItems)):
        assert events.wait_for("acked", timeout=60)
    assert list(WorkLog.objects.values_list("key", "attempt")) == [(sent.key[0], 2)]
    assert not FailedDelivery.objects.exists()


def test_a_periodic_schedule_whose_message_went_is_seeded_again_while_running(
    make_worker: MakeWorker,
) -> None:
    """A periodic message that was dead-lettered (or deleted) stopped its schedule until a
    worker restarted; the worker now re-seeds every reseed_interval."""
    with running(make_worker(Ticks, reseed_interval=0.2)):
        wait_until(lambda: WorkLog.objects.filter(note="tick").exists())
        Ticks.objects.filter(name="tick").delete()  # e.g. dead-lettered by an operator
        before = WorkLog.objects.filter(note="tick").count()
        wait_until(lambda: WorkLog.objects.filter(note="tick").count() >= before + 2)
    assert Ticks.objects.filter(name="tick").exists()


def test_reseed_interval_must_be_positive(make_worker: MakeWorker) -> None:
    from spanner_queues.exceptions import InvalidArgument

    with pytest.raises(InvalidArgument):
        make_worker(Ticks, reseed_interval=0)
