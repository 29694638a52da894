"""Notifications, delivered in per-user digests (pattern 8, temporal batching)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from spanner_queues.models import Queue


def new_id() -> str:
    return uuid.uuid4().hex


class Notifications(Queue):
    """One message per notification; all of a user's notifications in one window are due at
    the same instant, so the batch receiver gets them together."""

    user_id = models.BigIntegerField()
    id = models.CharField(max_length=32, default=new_id)
    pk = models.CompositePrimaryKey("user_id", "id")

    class Meta:
        verbose_name_plural = "notifications"


class Digest(models.Model):
    """A digest email that was sent (for the admin and the tests)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    items = models.PositiveIntegerField()
    sent_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.items} notification(s) for {self.user}"
