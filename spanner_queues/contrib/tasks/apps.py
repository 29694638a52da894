from __future__ import annotations

from django.apps import AppConfig


class TasksConfig(AppConfig):
    """Django's Tasks API on spanner_queues: the task queue, the results and their admin, and
    the receiver that runs the tasks of every ``QueueBackend`` in ``TASKS``."""

    name = "spanner_queues.contrib.tasks"
    label = "spanner_queues_tasks"
    verbose_name = "Spanner queues tasks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # the runner imports the app's models: only once the registry is ready
        from spanner_queues.contrib.tasks.runner import connect

        connect()  # the task receiver, for the queues of each QueueBackend in TASKS
