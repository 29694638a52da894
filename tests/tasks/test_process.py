"""``manage.py runqueueworker`` with no arguments, as a real child process, runs enqueued tasks
(a sync, an async and a failing one) and stops gracefully on SIGTERM."""

from __future__ import annotations

import signal

import pytest

from spanner_queues.contrib.tasks.framework import TaskResultStatus
from tests.children import Child
from tests.conftest import wait_until
from tests.tasksapp import tasks
from tests.tasksapp.models import Thing

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_runqueueworker_without_arguments_runs_tasks(child_env, tmp_path) -> None:
    results = [
        tasks.add.enqueue(1, 2),
        tasks.async_add.enqueue(2, 3),
        tasks.fail_after_write.enqueue(4),
    ]
    child = Child(child_env, tmp_path)  # no queue named: every queue with receivers, tasks too
    try:

        def done() -> bool:
            for r in results:
                r.refresh()
            return all(r.is_finished for r in results)

        wait_until(done, timeout=120)
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(120) == 0, child.output()
    finally:
        child.kill()
    added, added_async, failed = results
    assert added.status == TaskResultStatus.SUCCESSFUL and added.return_value == 3
    assert added_async.status == TaskResultStatus.SUCCESSFUL
    assert added_async.return_value == 5  # (no Thing rows: the failed task's rolled back)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is ValueError
    assert not Thing.objects.exists()
    assert all(len(r.worker_ids) == 1 for r in results)
    out = child.output()  # the failure is visible: counted, and logged with its traceback
    assert " failed=1 " in out, out  # (processed: the two tasks, and other queues' messages)
    assert 'raise ValueError(f"no thing {num}")' in out and f"id={failed.id!r}" in out, out
    assert "NoneType: None" not in out, out
