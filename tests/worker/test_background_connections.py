"""The worker's background reads (the stats cache's reads, the ``/readyz`` database check) keep
the number of threads of the process flat however often they run: each Spanner connection
opened and closed used to leave a google-cloud-spanner ``maintenance-multiplexed-session``
thread (and its client) alive for good."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable

import pytest

from spanner_queues.engines.stats import stats_cache
from spanner_queues.worker import Worker, WorkerEvent
from spanner_queues.worker.health import WorkerHealth, serve
from tests.workerapp.models import Tasks, WorkItems

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]
ROUNDS = 30
#: threads a round of reads may leave behind in all (a reader thread, gRPC's own)
SLACK = 6


def threads() -> tuple[int, int]:
    """(threads alive, of which google-cloud-spanner's session maintenance threads)."""
    alive = threading.enumerate()
    kept = [t for t in alive if t.name.startswith("maintenance-multiplexed-session")]
    return len(alive), len(kept)


def test_stats_reads_in_the_background_leave_no_thread_behind() -> None:
    stats_cache.clear()

    def read_round() -> None:
        reads = stats_cache.reads
        for model in (WorkItems, Tasks):
            stats_cache.peek(model, max_age=0)
        assert stats_cache.wait_idle(timeout=60)
        assert stats_cache.reads >= reads + 2

    read_round()  # the reading threads, their connections and sessions
    before = threads()
    for _ in range(ROUNDS):
        read_round()
    after = threads()
    assert after[1] <= before[1] + 1, (before, after)
    assert after[0] <= before[0] + SLACK, (before, after)


def test_readiness_checks_leave_no_thread_behind(make_worker: MakeWorker) -> None:
    health = WorkerHealth(db_check_seconds=0)
    worker = make_worker(WorkItems, Tasks)
    health.attach(worker)
    health(WorkerEvent(name="worker_started", worker_id="w"))
    server, port = serve(0, "127.0.0.1", health)
    try:

        def probe() -> int:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=60) as r:
                return int(r.status)

        assert probe() == 200
        before = threads()
        for _ in range(ROUNDS):
            assert probe() == 200
        after = threads()
    finally:
        server.shutdown()
        server.server_close()
    assert after[1] <= before[1] + 1, (before, after)
    assert after[0] <= before[0] + SLACK, (before, after)
