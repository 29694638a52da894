"""Models of the Tasks and test-kit tests: a user's own task queue (``QUEUE_MODELS``), a queue
with a receiver, and a plain model the tasks, receivers and callers write."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import Queue


class EmailTasks(Queue):
    """The queue of ``queue_name="emails"`` (``TASKS["default"]["OPTIONS"]["QUEUE_MODELS"]``)."""

    id = models.CharField(max_length=64, primary_key=True)

    class QueueMeta:
        payload_type = "json"


class Notifications(Queue):
    """The queue of the test kit's examples (``docs/howto/testing.md``)."""

    id = models.CharField(max_length=64, primary_key=True)

    class QueueMeta:
        payload_type = "json"


class Thing(models.Model):
    num = models.IntegerField()
    note = models.CharField(max_length=100, blank=True, default="")

    def __str__(self) -> str:
        return f"Thing {self.num}"
