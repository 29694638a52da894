"""The conformance suite's queues: composite, single and interleaved keys, an attempt limit with
a dead-letter queue, STRING and JSON payloads. Every queue takes the default engine alias (the
one ``--sq-conformance`` names for the run)."""

from __future__ import annotations

import uuid

from django.db import models

from spanner_queues.models import Queue


def new_id() -> str:
    return uuid.uuid4().hex


class Account(models.Model):
    name = models.CharField(max_length=100)
    balance = models.IntegerField(default=0)


class UserTasks(Queue):
    """Composite key, as in Google's UserTasks example."""

    user_id = models.BigIntegerField()
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("user_id", "message_id")


class Jobs(Queue):
    """Single-column key with a default: ``Jobs.send(payload=...)`` needs no key."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)


class Upload(models.Model):
    name = models.CharField(max_length=100)


class UploadTasks(Queue):
    """Interleaved in its parent on Spanner; a cascading ForeignKey elsewhere."""

    upload = models.ForeignKey(
        Upload, on_delete=models.CASCADE, db_column="id", db_constraint=False
    )
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("upload", "message_id")

    class QueueMeta:
        interleave_in_parent = "upload"


class Emails(Queue):
    """A queue with an attempt limit and a dead-letter queue."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        max_attempts = 3
        dead_letter_queue = "spanner_queues_conformance.EmailsDead"


class EmailsDead(Queue):
    id = models.CharField(max_length=64, primary_key=True, default=new_id)


class Greetings(Queue):
    """A STRING(MAX) payload, as in Google's queue samples; Spanner's TTL after 7 days."""

    id = models.BigIntegerField(primary_key=True)

    class QueueMeta:
        payload_type = "string"
        row_deletion_policy = {"older_than": "deliver_time", "days": 7}


class JsonEvents(Queue):
    """A JSON payload (a text column on the table engine)."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        payload_type = "json"


class OrderedEvents(Queue):
    """Ordered per key (``QueueMeta.ordered_by``): one message of a customer at a time, in
    send order."""

    customer = models.CharField(max_length=64)
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("customer", "message_id")

    class QueueMeta:
        ordered_by = ("customer",)
        max_attempts = 3
        discard_after_max_attempts = True
