"""A non-atomic batch receiver that acks some of its messages itself and then raises (the
Pub/Sub relay when Pub/Sub confirmed part of a batch): those acks stand and count as processed;
only the others fail and come back."""

from __future__ import annotations

from typing import Any

import pytest

from spanner_queues import api
from spanner_queues.receivers import ReceiverRegistry, receiver
from spanner_queues.worker import Worker, WorkerEvents
from tests.workerapp.models import WorkItems

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_messages_a_failing_non_atomic_receiver_acked_stay_acked_and_only_the_rest_fail() -> (
    None
):
    registry = ReceiverRegistry()
    runs: list[list[str]] = []

    @receiver(WorkItems, batch=True, atomic=False, registry=registry)
    def half(messages: list[Any]) -> None:
        runs.append([m.key[0] for m in messages])
        done = [m for m in messages if m.key[0].startswith("ok")]
        api.ack_many(WorkItems, done)
        if len(done) < len(messages):
            raise RuntimeError("the bus took only some of them")

    WorkItems.send_many([{"id": i, "payload": {}} for i in ("ok1", "ok2", "no1")])
    events = WorkerEvents()
    worker = Worker(
        [WorkItems],
        registry=registry,
        max_messages=3,
        install_signal_handlers=False,
        listeners=[events],
        batch_size=3,
    )
    stats = worker.run()
    assert sorted(runs[0]) == ["no1", "ok1", "ok2"]
    assert stats.processed == 2 and stats.failed == 1
    assert sorted(m.key[0] for m in events.messages("acked")) == ["ok1", "ok2"]
    assert [m.key[0] for m in events.messages("failed")] == ["no1"]
    assert list(WorkItems.objects.values_list("id", flat=True)) == ["no1"]
    assert not [e for e in events.history if e.name == "released" and e.message.key[0] != "no1"]


def test_the_error_of_a_non_atomic_receiver_that_acked_all_its_messages_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its acks stand and nothing fails, but the error is not swallowed: it is logged with its
    traceback, naming the receiver."""
    registry = ReceiverRegistry()

    @receiver(WorkItems, batch=True, atomic=False, registry=registry)
    def all_then_raise(messages: list[Any]) -> None:
        api.ack_many(WorkItems, messages)
        raise RuntimeError("after the acks")

    WorkItems.send_many([{"id": i, "payload": {}} for i in ("a1", "a2")])
    worker = Worker(
        [WorkItems],
        registry=registry,
        max_messages=2,
        install_signal_handlers=False,
        batch_size=2,
    )
    with caplog.at_level("ERROR", logger="spanner_queues.worker"):
        stats = worker.run()
    assert stats.processed == 2 and stats.failed == 0
    assert not WorkItems.objects.exists()
    [record] = [r for r in caplog.records if r.exc_info and "after the acks" in str(r.exc_info[1])]
    assert "all_then_raise" in record.getMessage()
