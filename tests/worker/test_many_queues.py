"""A worker serving several queues takes from each what it can have now: on native queues a
receive waited for its queue's stream (``RECEIVE_WAIT_SECONDS``), so a round over N idle queues
took N waits and a message on the last queue waited for all of them (a worker with every
queue of the test project ran a task 15 s after it was enqueued). One queue alone still waits
on its stream, which hands a message over the moment it is due."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from spanner_queues import api
from spanner_queues.exceptions import InvalidArgument
from spanner_queues.worker import Worker, WorkerEvents
from tests.worker.conftest import watch_receives
from tests.workerapp.models import Events, WorkItems, WorkLog

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


def _waits(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The ``wait`` of every receive the worker makes."""
    waits: list[Any] = []
    watch_receives(
        monkeypatch, lambda kwargs, got: waits.append(kwargs.get("wait")), Events, WorkItems
    )
    return waits


def test_a_worker_of_several_queues_waits_on_no_queues_stream(
    make_worker: MakeWorker, events: WorkerEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = _waits(monkeypatch)
    event = Events.send(payload={"type": "other"})
    item = WorkItems.send(payload={})
    stats = make_worker(WorkItems, Events, burst=True).run()
    assert stats.processed == 2 and stats.failed == 0
    logged = sorted(WorkLog.objects.values_list("key", flat=True))
    assert logged == sorted([event.key[0], item.key[0]])
    assert waits and set(waits) == {0.0}


def test_a_worker_of_one_queue_waits_on_its_stream(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = _waits(monkeypatch)
    WorkItems.send(payload={})
    stats = make_worker(WorkItems, burst=True).run()
    assert stats.processed == 1
    assert waits and set(waits) == {None}


@pytest.mark.engine_independent
def test_receive_refuses_a_negative_wait() -> None:
    with pytest.raises(InvalidArgument, match="wait"):
        api.receive(WorkItems, wait=-1)
