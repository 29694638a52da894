"""Queues and a work log for the worker tests."""

from __future__ import annotations

import uuid

from django.db import models

from spanner_queues.models import Queue


def new_id() -> str:
    return uuid.uuid4().hex


class WorkLog(models.Model):
    """One row per receiver run that committed (written in the ack transaction)."""

    key = models.CharField(max_length=64)
    attempt = models.IntegerField(default=0)
    worker = models.CharField(max_length=64, default="")
    note = models.CharField(max_length=64, default="")


class WorkItems(Queue):
    """The general test queue; its receiver obeys instructions in a JSON payload."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        max_attempts = 3
        dead_letter_queue = "workerapp.WorkItemsDead"


class WorkItemsDead(Queue):
    id = models.CharField(max_length=64, primary_key=True, default=new_id)


class Tasks(Queue):
    """A polymorphic queue: the ``kind`` key column chooses the receiver."""

    kind = models.CharField(max_length=32)
    id = models.CharField(max_length=64, default=new_id)
    pk = models.CompositePrimaryKey("kind", "id")


class Events(Queue):
    """Receivers chosen by the ``type`` field of a JSON payload."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)


class Dirty(Queue):
    """Batch receiver: a whole batch is acked in one transaction."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)


class Pings(Queue):
    """One attempt only, then dropped."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        max_attempts = 1
        discard_after_max_attempts = True


class Ticks(Queue):
    """A periodic schedule keyed by name."""

    name = models.CharField(max_length=64, primary_key=True)


class Jobs(Queue):
    """Receivers chosen by the ``kind`` key column, without a catch-all: a ``kind`` no receiver
    of this process knows is what an older worker sees of a newer release (a rolling deploy)."""

    kind = models.CharField(max_length=32)
    id = models.CharField(max_length=64, default=new_id)
    pk = models.CompositePrimaryKey("kind", "id")

    class QueueMeta:
        max_attempts = 2
        discard_after_max_attempts = True


class Limited(Queue):
    """At most two of its messages run at once in one worker process."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)

    class QueueMeta:
        concurrency_limit = 2
