"""The worker's summary line (``runqueueworker -v1``): each queue's depth, read after the work
ended in a burst (not ``?``), and the age of a depth read earlier than the line's interval."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from spanner_queues.engines.stats import Reading, stats_cache
from spanner_queues.management.commands.runqueueworker import Command
from spanner_queues.worker import Worker
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
