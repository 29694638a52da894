"""``queuegrants`` against what runs: every write a web request (enqueue, pause) and a worker
(run the tasks, prune old results) make to a table of spanner_queues or a queue is granted to
that role. (The worker deleted old task results with no ``DELETE`` granted.)"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db.backends import utils
from django.utils import timezone

from spanner_queues import api, clock
from spanner_queues.contrib.tasks import runner
from spanner_queues.contrib.tasks.models import TaskMessage, TaskResultRecord
from tests.tasksapp import tasks
from tests.tasksapp.models import EmailTasks

pytestmark = pytest.mark.django_db(transaction=True)

_WRITE = re.compile(r'^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+["`]?(\w+)', re.IGNORECASE)
_GRANT = re.compile(r'^GRANT ([A-Z, ]+) ON (?:TABLE|QUEUE) "?(\w+)"? TO (\w+);$')


@pytest.fixture
def writes() -> Iterator[set[tuple[str, str]]]:
    """(verb, table) of every write statement run, on every thread, while the test runs."""
    seen: set[tuple[str, str]] = set()
    lock = threading.Lock()
    real_execute, real_many = utils.CursorWrapper.execute, utils.CursorWrapper.executemany

    def note(sql: Any) -> None:
        found = _WRITE.match(str(sql))
        if found:
            with lock:
                seen.add((found.group(1).split()[0].upper(), found.group(2).lower()))

    def execute(self: Any, sql: Any, params: Any = None) -> Any:
        note(sql)
        return real_execute(self, sql, params)

    def executemany(self: Any, sql: Any, param_list: Any) -> Any:
        note(sql)
        return real_many(self, sql, param_list)

    utils.CursorWrapper.execute, utils.CursorWrapper.executemany = execute, executemany  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        utils.CursorWrapper.execute, utils.CursorWrapper.executemany = real_execute, real_many  # type: ignore[method-assign]


def _granted(*queues: str) -> set[tuple[str, str, str]]:
    out = StringIO()
    args = ["--role-sender", "web", "--role-worker", "worker", "--dialect", "postgresql"]
    for q in queues:
        args += ["--queue", q]
    call_command("queuegrants", *args, stdout=out)
    granted = set()
    for line in out.getvalue().splitlines():
        found = _GRANT.match(line)
        if found:
            for verb in found.group(1).split(", "):
                granted.add((found.group(3), verb, found.group(2).lower()))
    return granted


def _ours(table: str, queues: set[str]) -> bool:
    return table.startswith("spanner_queues") or table in queues


def test_every_write_of_the_web_and_the_worker_is_granted(
    settings, run_worker, writes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # queuegrants prints Spanner's grants: it needs the Spanner driver (the `spanner` extra,
    # not installed on the Django 6.1 line)
    pytest.importorskip("google.cloud.spanner_v1")
    monkeypatch.setattr(runner, "_prunes", clock.Throttle())  # (once a minute per process)
    settings.TASKS = {
        "default": {
            "BACKEND": "spanner_queues.contrib.tasks.QueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {
                "QUEUE_MODELS": {"emails": "tasksapp.EmailTasks"},
                "RESULT_RETENTION_SECONDS": 3600,
            },
        }
    }
    queues = {TaskMessage._meta.db_table, EmailTasks._meta.db_table}
    old = tasks.add.enqueue(1, 1)  # its result row is written when it finishes
    run_worker(lambda: TaskResultRecord.objects.filter(id=old.id, status="SUCCESSFUL").exists())
    TaskResultRecord.objects.filter(id=old.id).update(  # finished two hours ago: pruned next
        finished_at=timezone.now() - timedelta(hours=2)
    )
    monkeypatch.setattr(runner, "_prunes", clock.Throttle())
    writes.clear()
    # the web: enqueue a task, pause and resume a queue
    tasks.add.enqueue(2, 2)
    api.pause(TaskMessage, reason="deploy")
    api.resume(TaskMessage)
    web = {w for w in writes if _ours(w[1], queues)}
    writes.clear()
    run_worker(lambda: not TaskResultRecord.objects.filter(id=old.id).exists())
    worker = {w for w in writes if _ours(w[1], queues)}
    assert ("DELETE", TaskResultRecord._meta.db_table) in worker  # the pruning ran
    granted = _granted("spanner_queues_tasks.TaskMessage", "tasksapp.EmailTasks")
    assert {w for w in web if ("web", *w) not in granted} == set()
    assert {w for w in worker if ("worker", *w) not in granted} == set()
