"""The worker benchmark's models: an ORM row written with each message or task."""

from __future__ import annotations

import uuid

from django.db import models

from spanner_queues.models import Queue


def new_id() -> str:
    return uuid.uuid4().hex


class Order(models.Model):
    n = models.IntegerField()


class OrderTasks(Queue):
    id = models.CharField(max_length=64, primary_key=True, default=new_id)


class OrderBatches(Queue):
    """The same messages for a batch receiver (one ack transaction per batch)."""

    id = models.CharField(max_length=64, primary_key=True, default=new_id)
