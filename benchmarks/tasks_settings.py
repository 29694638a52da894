"""Settings for ``benchmarks/tasks_vs_django_tasks_db.py``: ``benchmarks/worker_settings.py``
(one SQLite file, WAL, ``IMMEDIATE``, persistent connections) with two Tasks backends on it:
django-tasks-db (``"default"``) and spanner_queues' ``QueueBackend`` (``"queues"``).
``$SQ_BENCH_CONN_MAX_AGE`` sets ``CONN_MAX_AGE`` for both (default ``None``: persistent; ``0`` is
Django's default, with which ``db_worker``'s ``close_old_connections()`` reconnects per task)."""

from __future__ import annotations

import os

from benchmarks.worker_settings import *  # noqa: F403
from benchmarks.worker_settings import DATABASES

_age = os.environ.get("SQ_BENCH_CONN_MAX_AGE", "none").lower()
DATABASES["default"]["CONN_MAX_AGE"] = None if _age == "none" else int(_age)

TASKS = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
    "queues": {"BACKEND": "spanner_queues.contrib.tasks.QueueBackend"},
}

# The framework's own per-task log lines (django.tasks' INFO "Task id=... state=...", sent for
# both backends alike) are left out: they measure the console, not the backends.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {name: {"level": "WARNING"} for name in ("django.tasks", "django_tasks")},
}
