"""Envelope queues (CloudEvents) of each payload type, a raw JSON queue, and an outbox model."""

from __future__ import annotations

import uuid

from django.db import models

from spanner_queues.models import Queue


def new_id() -> str:
    return uuid.uuid4().hex


class Events(Queue):
    """CloudEvents around a JSON payload."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        payload_type = "json"
        envelope = "cloudevents"


class BytesEvents(Queue):
    """CloudEvents in a bytes queue (bytes data travels as ``data_base64``)."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        envelope = "cloudevents"


class TextEvents(Queue):
    """CloudEvents in a string queue."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        payload_type = "string"
        envelope = "cloudevents"


class RawEvents(Queue):
    """No envelope: the raw JSON payload, no trace context."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        payload_type = "json"


class Order(models.Model):
    total = models.IntegerField(default=0)


class OrderEvents(Queue):
    """The outbox's queue of ``Order`` changes, as CloudEvents."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        payload_type = "json"
        envelope = "cloudevents"


class Ran(models.Model):
    """What a receiver of ``tests.tracingapp.receivers`` ran (for process tests)."""

    queue = models.CharField(max_length=100)
    key = models.CharField(max_length=64)
    data = models.TextField()


class TaskEvents(Queue):
    """A Tasks backend's queue as CloudEvents (``tests/tracing/test_django_task.py``)."""

    id = models.CharField(max_length=64, primary_key=True)

    class QueueMeta:
        payload_type = "json"
        envelope = "cloudevents"


class KeyedByEvent(Queue):
    """A queue whose key field is named ``event`` (reserved for ``event=`` on envelope queues
    only)."""

    event = models.CharField(max_length=64, primary_key=True)
