"""Group commit on native queues, through the front's fault control: a group whose commit is
aborted runs again (the DB-API replays it, or the worker runs it from the start) and commits
each receiver's write once, with its message's ack; the group's acks ride its commit in one
DELETE statement."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import grpc
import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.engines import engines
from spanner_queues.receivers import ReceiverRegistry, receiver
from spanner_queues.worker import Worker
from spanner_queues.worker.events import WorkerEvents
from tests.testapp.models import Account, Jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _drain(registry: ReceiverRegistry, count: int) -> Any:
    events = WorkerEvents()
    worker = Worker(
        [Jobs],
        registry=registry,
        install_signal_handlers=False,
        summary_interval=None,
        listeners=[events],
        prefetch=20,
        group_size=count,
        group_ms=60_000,
    )

    def stop_when_drained() -> None:
        events.wait_for("acked", count, timeout=120)
        worker.stop()

    stopper = threading.Thread(target=stop_when_drained, daemon=True)
    stopper.start()
    try:
        stats = worker.run()
    finally:
        worker.stop()
        stopper.join(10)
        engines["default"].stop_receiving(wait=30)
    assert events.counts["acked"] == count
    return stats


def test_an_aborted_group_commit_runs_again_and_commits_each_write_once(front) -> None:
    count = 10
    registry = ReceiverRegistry()

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        Account.objects.create(name=message.key[0])

    with transaction.atomic():
        api.send_many(Jobs, [{"id": f"c{i:02}", "payload": b"x"} for i in range(count)])
    front.clear()
    front.fail("Commit", grpc.StatusCode.ABORTED, "Transaction was aborted")
    stats = _drain(registry, count)
    names = Counter(Account.objects.values_list("name", flat=True))
    assert sorted(names) == [f"c{i:02}" for i in range(count)]
    assert set(names.values()) == {1}  # each write committed once
    assert not Jobs.objects.exists()
    assert stats.groups < stats.grouped
    acks = [r for r in front.sql("DELETE FROM testapp_jobs")]
    assert len(acks) <= 2 * stats.groups  # one DELETE per group (and per replay)
