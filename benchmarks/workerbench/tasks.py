"""The same no-op as a django-tasks task (run by django-tasks-db's ``db_worker``)."""

from __future__ import annotations

from benchmarks.workerbench import trace
from spanner_queues.contrib.tasks.framework import task


@task()
def noop(key: str) -> None:
    trace.started(key)
