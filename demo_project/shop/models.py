"""The demo shop's queues."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import Queue


class UserTasks(Queue):
    """Work to do for a user after sign-up (Google's UserTasks example)."""

    user_id = models.BigIntegerField()
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("user_id", "message_id")
