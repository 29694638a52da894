"""The same no-op as a django-tasks task (run by django-tasks-db's ``db_worker``)."""

from __future__ import annotations

from django_tasks import task

from benchmarks.workerbench import trace


@task()
def noop(key: str) -> None:
    trace.started(key)
