"""Cancelling a task's message (``api.cancel``): its result ends ``CANCELLED`` where Django's
Tasks API has that state, else ``FAILED`` with the cancellation (who, why) as its error; a
task is not run again after it."""

from __future__ import annotations

from typing import Any

import pytest

from spanner_queues import api
from spanner_queues.contrib.tasks.framework import TaskResultStatus, default_task_backend
from spanner_queues.contrib.tasks.models import TaskMessage
from spanner_queues.drivers import driver_for
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import Cancelled
from tests.tasks import failing_tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: the state of a cancelled task's result in the installed Tasks API
CANCELLED = getattr(TaskResultStatus, "CANCELLED", TaskResultStatus.FAILED)


def _assert_cancelled(result: Any, reason: str, by: str) -> None:
    stored = default_task_backend.get_result(result.id)
    assert stored.status == CANCELLED
    [error] = stored.errors
    assert error.exception_class_path == "spanner_queues.exceptions.Cancelled"
    assert f"cancelled by {by}: {reason}" in error.traceback


def test_cancelling_a_pending_task_finishes_its_result_and_it_never_runs(run_worker) -> None:
    result = failing_tasks.add.enqueue(1, 2)
    record = api.cancel(TaskMessage, (result.id,), reason="wrong customer", by="erin")
    assert not record.running
    assert not TaskMessage.objects.exists()
    _assert_cancelled(result, "wrong customer", "erin")


def test_a_running_task_that_looks_stops_on_a_cancel(run_worker) -> None:
    db = engine_for(TaskMessage).database
    if driver_for(db).single_writer:
        pytest.skip("an atomic task holds the database's one write lock: the cancel waits")
    failing_tasks.LOOPING.clear()
    result = failing_tasks.loop_until_cancelled.enqueue()
    asked: list[Any] = []

    def done() -> bool:
        if failing_tasks.LOOPING.is_set() and not asked:
            asked.append(api.cancel(TaskMessage, (result.id,), reason="too slow", by="frank"))
        result.refresh()
        return result.is_finished

    events = run_worker(done)
    assert events.wait_for("cancelled", timeout=1)
    assert events.counts["failed"] == 0
    _assert_cancelled(result, "too slow", "frank")
    assert not TaskMessage.objects.exists()
    [event] = [e for e in events.history if e.name == "cancelled"]
    assert isinstance(event.error, Cancelled)
