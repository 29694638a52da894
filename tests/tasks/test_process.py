"""``manage.py runqueueworker`` with no arguments, as a real child process, runs enqueued tasks
(a sync, an async and a failing one) and stops gracefully on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django_tasks import TaskResultStatus

from tests.conftest import wait_until
from tests.tasksapp import tasks
from tests.tasksapp.models import Thing

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def test_runqueueworker_without_arguments_runs_tasks(child_env, tmp_path) -> None:
    results = [tasks.add.enqueue(1, 2), tasks.async_add.enqueue(2, 3),
               tasks.fail_after_write.enqueue(4)]
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runqueueworker"],
            env=child_env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        def done() -> bool:
            for r in results:
                r.refresh()
            return all(r.is_finished for r in results)

        wait_until(done, timeout=120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    added, added_async, failed = results
    assert added.status == TaskResultStatus.SUCCESSFUL and added.return_value == 3
    assert added_async.status == TaskResultStatus.SUCCESSFUL
    assert added_async.return_value == 5  # (no Thing rows: the failed task's rolled back)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is ValueError
    assert not Thing.objects.exists()
    assert all(len(r.worker_ids) == 1 for r in results)
