"""Settings for ``benchmarks/tasks_vs_django_tasks_db.py``: ``benchmarks/worker_settings.py``
(one SQLite file, WAL, ``IMMEDIATE``, persistent connections) with two Tasks backends on it:
django-tasks-db (``"default"``) and spanner_queues' ``QueueBackend`` (``"queues"``)."""

from __future__ import annotations

from benchmarks.worker_settings import *  # noqa: F403

TASKS = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
    "queues": {"BACKEND": "spanner_queues.tasks.QueueBackend"},
}
