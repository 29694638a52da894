"""What queue depth costs: the worker's summary line and the metrics read each queue's stats (a
scan of the queue) at most once per ``STATS_MAX_AGE_SECONDS`` per process, however often they
are shown, and never on the worker's intake thread. The bound is pinned by counting
``engine.stats()`` calls, not by timing."""

from __future__ import annotations

import io
import math
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from spanner_queues.engines import engines
from spanner_queues.engines.stats import STATS_MAX_AGE_SECONDS, stats_cache
from spanner_queues.management.commands.runqueueworker import Command
from spanner_queues.worker import Worker, WorkerEvents
from tests.worker.conftest import running
from tests.workerapp.models import Tasks, WorkItems

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


@pytest.fixture
def stats_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every ``engine.stats()`` call of the default engine's class, with its thread's name."""
    calls: list[str] = []
    engine_class = type(engines["default"])
    real = engine_class.stats

    def counted(self: object, model: type) -> object:
        calls.append(threading.current_thread().name)
        return real(self, model)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_class, "stats", counted)
    stats_cache.clear()
    yield calls
    stats_cache.clear()


def summary_command(worker: Worker) -> Command:
    """The command's -v1 output over ``worker`` (its summary line is the one printed)."""
    command = Command(stdout=io.StringIO())
    command._verbosity = 1
    command._last = (time.monotonic(), 0)
    command._worker = worker
    return command


def test_summary_lines_read_each_queue_at_most_once_per_max_age(
    make_worker: MakeWorker, events: WorkerEvents, stats_calls: list[str]
) -> None:
    rounds = 40
    worker = make_worker(WorkItems, Tasks, summary_interval=0.01)
    command = summary_command(worker)
    worker.listeners.append(command._on_event)
    started = time.monotonic()
    with running(worker):
        assert events.wait_for("summary", rounds, timeout=120)
    elapsed = time.monotonic() - started
    queues = len(worker.plans)
    # one read per queue per STATS_MAX_AGE_SECONDS at most (the at-stop summary included)
    bound = queues * (1 + math.ceil(elapsed / STATS_MAX_AGE_SECONDS))
    assert 0 < len(stats_calls) <= bound, (len(stats_calls), bound, elapsed)
    # never on the intake thread (the worker's loop): a slow database cannot hold it up
    assert threading.main_thread().name not in stats_calls
    assert "test-worker" not in stats_calls
    lines = command.stdout.getvalue().splitlines()  # type: ignore[attr-defined]
    assert len(lines) >= rounds and "depth: workerapp.WorkItems=" in lines[-1]


def test_the_metrics_and_the_summary_share_their_reads(
    make_worker: MakeWorker, stats_calls: list[str]
) -> None:
    pytest.importorskip("prometheus_client")
    from spanner_queues.contrib.metrics import QueueGauges
    from spanner_queues.queues import queue_models

    gauges = QueueGauges()
    for _ in range(10):  # ten refreshes within the interval: one read per queue
        gauges.measured = None  # (as the sampler, whose last refresh is older than max_age)
        gauges.refresh(max_age=STATS_MAX_AGE_SECONDS)
    declared = len(queue_models())
    assert len(stats_calls) == declared
    worker = make_worker(WorkItems)
    command = summary_command(worker)
    for _ in range(10):
        command._summary(worker.stats)  # served by the metrics' reads: none more
    assert len(stats_calls) == declared
