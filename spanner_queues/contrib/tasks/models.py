"""The task queue and the task results of the ``spanner_queues_tasks`` app.

``TaskMessage`` is a JSON-payload queue keyed by the task result's id; ``TaskResultRecord``
keeps one row per enqueued task (status, arguments, return value, errors, workers). Both live
on the task queue's database, so ``enqueue()`` writes them in one transaction. JSON is kept as
text (``TextField``): every database stores it, the Spanner emulator included.

Both name their ``app_label``, so this module imports even when the app is not installed
(django-tasks builds the backend, which imports it, wherever a task is declared): the check
``spanner_queues.E104`` then says what is missing, instead of Django's ``RuntimeError``.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from spanner_queues.models import Queue

APP_LABEL = "spanner_queues_tasks"

#: statuses of ``django_tasks.TaskResultStatus`` (kept here so the model needs no django-tasks)
READY, RUNNING, FAILED, SUCCESSFUL = "READY", "RUNNING", "FAILED", "SUCCESSFUL"
STATUS_CHOICES = [(s, s.capitalize()) for s in (READY, RUNNING, FAILED, SUCCESSFUL)]
FINISHED = (FAILED, SUCCESSFUL)
#: in ``worker_ids``: a delivery that left no trace of its worker (its lease was lost, or the
#: task is running now on an engine whose running tasks write no row)
UNKNOWN_WORKER = "unknown"


class TaskMessage(Queue):
    """The default queue of ``spanner_queues.contrib.tasks.QueueBackend``: one message per task."""

    id = models.CharField(max_length=64, primary_key=True)

    class Meta:
        app_label = APP_LABEL
        verbose_name = "task message"

    class QueueMeta:
        payload_type = "json"


#: one encoder for every call (it keeps no state between them): made per call, it was half a
#: short value's cost
_encoder = DjangoJSONEncoder(separators=(",", ":"))


def dumps(value: Any) -> str:
    """Compact JSON (Django's encoder); an empty list or dict without the encoder (most
    tasks' kwargs, errors and first worker ids)."""
    if not value and type(value) in (list, dict):
        return "[]" if type(value) is list else "{}"
    return _encoder.encode(value)


def loads(text: str) -> Any:
    """``json.loads``; ``"[]"`` and ``"{}"`` without the parser."""
    if text == "[]":
        return []
    if text == "{}":
        return {}
    return json.loads(text)


class TaskResultRecord(models.Model):
    """One enqueued task and what became of it (read-only in the admin)."""

    id = models.CharField(max_length=64, primary_key=True)
    task_path = models.CharField(max_length=300)
    backend = models.CharField(max_length=100)
    queue_name = models.CharField(max_length=100)
    queue = models.CharField(max_length=200)
    priority = models.IntegerField(default=0)
    takes_context = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=STATUS_CHOICES, default=READY)
    args_json = models.TextField(default="[]")
    kwargs_json = models.TextField(default="{}")
    return_value_json = models.TextField(blank=True, default="")
    #: ``[{"exception_class_path": ..., "traceback": ...}, ...]``
    errors_json = models.TextField(default="[]")
    worker_ids_json = models.TextField(default="[]")
    #: deliveries of the task's message, as the queue counts them (the last one seen)
    attempts = models.PositiveIntegerField(default=0)
    enqueued_at = models.DateTimeField()
    run_after = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        verbose_name = "task result"
        default_permissions = ("view",)
        indexes = [models.Index(fields=["status", "finished_at"], name="sq_task_status_finished")]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} {self.status}"

    @property
    def args(self) -> list[Any]:
        return loads(self.args_json)

    @property
    def kwargs(self) -> dict[str, Any]:
        return loads(self.kwargs_json)

    @property
    def errors(self) -> list[dict[str, str]]:
        return loads(self.errors_json)

    @property
    def worker_ids(self) -> list[str]:
        return loads(self.worker_ids_json)

    @property
    def return_value(self) -> Any:
        return json.loads(self.return_value_json) if self.return_value_json else None
