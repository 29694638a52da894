"""Django's Tasks API (``django.tasks`` on Django 6; the ``django-tasks`` backport on Django
5.2) on spanner_queues: an optional app (label ``spanner_queues_tasks``).

    INSTALLED_APPS += ["spanner_queues.contrib.tasks"]  # and "django_tasks" on Django 5.2
    TASKS = {"default": {"BACKEND": "spanner_queues.contrib.tasks.QueueBackend"}}

``enqueue()`` sends a message to a queue on the caller's connection, in the caller's
transaction: the task commits with the caller's writes or not at all. ``manage.py
runqueueworker`` runs it. ``manage.py migrate spanner_queues_tasks`` creates its queue and
results table. See ``docs/howto/tasks.md``.

The public names: ``QueueBackend``, ``was_dropped(result)`` (an ``enqueue()`` of a task with
``unique_for`` dropped within its window), and the models ``TaskResultRecord`` (one row per
enqueued task) and ``TaskMessage`` (the default task queue), all imported lazily from here::

    from spanner_queues.contrib.tasks import TaskResultRecord

(the models need the app registry ready, as any Django model; ``TASKS`` naming this backend
without the app in ``INSTALLED_APPS`` is the system check error ``spanner_queues.E104``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["QueueBackend", "TaskMessage", "TaskResultRecord", "was_dropped"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # on first use: Django imports this package before the app registry is ready, and
        # the backend and the models need it ready
        from spanner_queues.contrib.tasks import backend, models

        return getattr(backend if name in ("QueueBackend", "was_dropped") else models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
