"""While a worker runs, the heap it started with is out of the garbage collector's scans
(``gc.freeze()``), and given back to them (``gc.unfreeze()``) when the last running worker
returns; a process's own frozen heap is left alone."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest

from spanner_queues.worker import Worker, WorkerEvent, heap_frozen  # (not public)
from tests.workerapp.models import WorkItems

MakeWorker = Callable[..., Worker]


@pytest.fixture(autouse=True)
def nothing_frozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_leaves_the_heap_it_started_with_out_of_the_collectors_scans(
    make_worker: MakeWorker,
) -> None:
    frozen_while_running: list[int] = []

    def look(event: WorkerEvent) -> None:
        if event.name == "acked":
            frozen_while_running.append(gc.get_freeze_count())

    WorkItems.send_many([{"payload": {}} for _ in range(3)])
    stats = make_worker(WorkItems, burst=True, listeners=[look]).run()
    assert stats.processed == 3
    assert len(frozen_while_running) == 3 and min(frozen_while_running) > 1000
    assert gc.get_freeze_count() == 0  # given back


def test_the_heap_is_given_back_when_the_last_running_worker_returns() -> None:
    # (counts only: a frozen object may still be freed by its reference count meanwhile)
    with heap_frozen():
        assert gc.get_freeze_count() > 1000
        with heap_frozen():  # a second worker, started while the first runs
            assert gc.get_freeze_count() > 1000
        assert gc.get_freeze_count() > 1000  # the first still runs: still frozen
    assert gc.get_freeze_count() == 0


def test_a_heap_the_process_froze_itself_stays_frozen() -> None:
    gc.freeze()  # a pre-fork server's, before the worker
    with heap_frozen():
        pass
    assert gc.get_freeze_count() > 1000  # not given back by the worker
