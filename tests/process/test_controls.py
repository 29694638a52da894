"""The operator controls through a real ``runqueueworker`` child, on whichever database the
suite runs: a paused queue (``pausequeue``) is left alone by a running worker and drained once
``resumequeue`` is called; ``QueueMeta.concurrency_limit`` holds under load with more threads
than the limit. The commands run in the test process (``call_command``); the child sees the
pause through the queue's database, as every worker does."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from spanner_queues import api
from spanner_queues.options import queue_options
from tests.children import TIMEOUT, Child
from tests.conftest import wait_until
from tests.workerapp.models import Events, Limited, WorkItems, WorkLog

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def child(child_env: dict[str, str], tmp_path: Path) -> Iterator[type[Child]]:
    started: list[Child] = []

    def start(*args: str) -> Child:
        c = Child(child_env, tmp_path, *args)
        started.append(c)
        return c

    yield start  # type: ignore[misc]
    for c in started:
        c.kill()


def _stop(worker: Child) -> None:
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()


def test_a_paused_queue_is_left_alone_by_a_worker_and_drained_after_resume(
    child, tmp_path: Path
) -> None:
    out = StringIO()
    call_command("pausequeue", "workerapp.WorkItems", reason="deploy", stdout=out)
    assert out.getvalue().strip() == "workerapp.WorkItems: paused"
    trace = tmp_path / "trace"
    WorkItems.send_many([{"id": f"held-{i}", "payload": {"trace": str(trace)}} for i in range(3)])
    worker = child("workerapp.WorkItems", "workerapp.Events", "-v1")
    # The other queue runs: the worker is receiving, and it read the paused set before its
    # first receive (every round reads it first, once per PAUSE_CHECK_SECONDS).
    Events.send(id="first", payload={"type": "note"})
    wait_until(lambda: WorkLog.objects.filter(key="first").exists(), timeout=TIMEOUT)
    # Later rounds still leave the paused queue alone.
    Events.send(id="second", payload={"type": "note"})
    wait_until(lambda: WorkLog.objects.filter(key="second").exists(), timeout=TIMEOUT)
    assert worker.proc.poll() is None, worker.output()
    assert not trace.exists()
    assert WorkItems.objects.count() == 3
    assert api.is_paused(WorkItems)

    call_command("resumequeue", "workerapp.WorkItems", stdout=out)
    assert out.getvalue().splitlines()[-1] == "workerapp.WorkItems: resumed"
    wait_until(lambda: not WorkItems.objects.exists(), timeout=TIMEOUT)
    ran = WorkLog.objects.filter(key__startswith="held-").values_list("key", flat=True)
    assert sorted(ran) == ["held-0", "held-1", "held-2"]
    _stop(worker)


def test_a_concurrency_limit_holds_under_load(child, tmp_path: Path) -> None:
    limit = queue_options(Limited).concurrency_limit
    assert limit == 2
    trace = tmp_path / "trace"
    sent = 6
    Limited.send_many(
        [{"id": f"m{i}", "payload": {"trace": str(trace), "pause": 0.3}} for i in range(sent)]
    )
    worker = child("workerapp.Limited", "--concurrency", "4", "-v1")

    def ends() -> int:
        return sum(1 for e in _events(trace) if e["event"] == "end")

    wait_until(lambda: ends() == sent and not Limited.objects.exists(), timeout=TIMEOUT)
    _stop(worker)
    events = _events(trace)
    assert sorted(e["key"] for e in events if e["event"] == "start") == [
        f"m{i}" for i in range(sent)
    ]
    running = most = 0
    for e in events:  # the lines in the order the receivers wrote them
        running += 1 if e["event"] == "start" else -1
        most = max(most, running)
    assert most <= limit, events


def _events(trace: Path) -> list[dict]:
    return [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
