"""The worker's summary line (``runqueueworker -v1``): each queue's depth, read after the work
ended in a burst (not ``?``), and the age of a depth read earlier than the line's interval."""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from spanner_queues.engines.stats import Reading, stats_cache
from spanner_queues.management.commands.runqueueworker import Command
from spanner_queues.worker import Worker
from tests.conftest import wait_until
from tests.workerapp.models import WorkItems

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


@pytest.fixture(autouse=True)
def empty_stats_cache() -> Iterator[None]:
    stats_cache.clear()
    yield
    stats_cache.clear()


def summary_command(worker: Worker) -> Command:
    """The command's -v1 output over ``worker``."""
    command = Command(stdout=io.StringIO())
    command._verbosity = 1
    command._last = (time.monotonic(), 0)
    command._worker = worker
    worker.listeners.append(command._on_event)
    return command


def printed(command: Command) -> list[str]:
    return command.stdout.getvalue().splitlines()  # type: ignore[attr-defined]


def test_a_burst_ends_with_each_queue_depth_read_after_the_work(make_worker: MakeWorker) -> None:
    WorkItems.send(id="now", payload={})
    WorkItems.send(id="later", payload={}, delay=timedelta(hours=1))  # stays: depth 1
    worker = make_worker(WorkItems, burst=True, summary_interval=10.0)
    command = summary_command(worker)
    assert worker.run().processed == 1
    [line] = [line for line in printed(command) if line.startswith("processed=")]
    assert "workerapp.WorkItems=1 (ready 0, leased 0)" in line, line
    assert "=?" not in line and " old" not in line


def test_a_depth_older_than_the_summary_interval_says_how_old(make_worker: MakeWorker) -> None:
    worker = make_worker(WorkItems, summary_interval=10.0)
    command = summary_command(worker)
    stats = stats_cache.get(WorkItems)  # a real reading, then made 25 s old
    key = stats_cache._key(WorkItems)
    stats_cache._readings[key] = Reading(stats, None, time.monotonic() - 25)
    line = command._summary(worker.stats)
    assert re.search(r"workerapp\.WorkItems=0 \(ready 0, leased 0; read 2[5-9] s ago\)", line), line
    stats_cache._readings[key] = Reading(stats, None, time.monotonic())  # fresh: no age
    line = command._summary(worker.stats)
    assert "workerapp.WorkItems=0 (ready 0, leased 0)" in line and "ago" not in line, line


def test_the_reads_at_stop_run_side_by_side_and_are_waited_for_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database that does not answer holds up the last summary line (and the stop) by
    ``wait`` in all, not once per queue: every queue's read starts before the wait."""
    from spanner_queues.engines import engines
    from tests.workerapp.models import Events, Tasks

    hung = threading.Event()
    started: list[str] = []
    engine_class = type(engines["default"])
    real = engine_class.stats

    def hanging(self: object, model: type) -> object:
        started.append(model._meta.label)
        hung.wait(60)
        return real(self, model)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_class, "stats", hanging)
    models = [WorkItems, Tasks, Events]
    waiting = threading.Thread(target=stats_cache.refresh, args=(models,), kwargs={"wait": 60})
    waiting.start()
    try:
        # every read is under way while the wait for the first has not ended
        wait_until(lambda: len(started) == 3, timeout=30)
        assert waiting.is_alive() and all(stats_cache.latest(m) is None for m in models)
    finally:
        hung.set()
    waiting.join(60)
    assert not waiting.is_alive()
    assert all(stats_cache.latest(m) is not None for m in models)  # what they read
