"""``runqueueworker --timeout`` as a real child process: a receiver that never returns (blocked
in a C call, inside its atomic transaction: on SQLite it holds the database's only write lock)
is cut off, and the worker exits with status 3 so that its supervisor restarts it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.children import TIMEOUT, Start
from tests.conftest import wait_until
from tests.workerapp.models import WorkItems, WorkLog

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_a_receiver_that_never_returns_makes_the_worker_exit_3(
    children: Start, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    WorkItems.send(id="hung", payload={"hang": "forever", "trace": str(trace)})
    worker = children("workerapp.WorkItems", "--timeout", "1", "--stuck-grace", "1", "-v1")
    wait_until(trace.exists, timeout=TIMEOUT)
    assert worker.wait() == 3, worker.output()
    out = worker.output()
    assert "ran past its time limit" in out and "could not be interrupted" in out
    # the process is gone with its transaction: the database is free, nothing was acked
    WorkItems.send(id="after", payload={})
    assert set(WorkItems.objects.values_list("id", flat=True)) == {"hung", "after"}
    assert not WorkLog.objects.exists()


def test_sigterm_stops_a_worker_whose_receiver_never_returns(
    children: Start, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    WorkItems.send(id="hung", payload={"hang": "forever", "trace": str(trace)})
    worker = children("workerapp.WorkItems", "--timeout", "3", "--stuck-grace", "1", "-v1")
    wait_until(trace.exists, timeout=TIMEOUT)
    worker.proc.send_signal(signal.SIGTERM)
    # the stop waits for the receiver only until its limit plus the grace
    assert worker.wait() == 3, worker.output()
    assert "stopping" in worker.output()
    assert WorkItems.objects.filter(id="hung").exists()
