"""Profiles and the per-user task queue (Google's ``UserTasks`` example)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from spanner_queues.models import Queue


class Profile(models.Model):
    """What a user edits about themselves; the search index is derived from it."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile"
    )
    display_name = models.CharField(max_length=100, blank=True)
    bio = models.TextField(blank=True)
    plan = models.CharField(max_length=16, default="trial")
    trial_ends_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.display_name or str(self.user)


class UserTasks(Queue):
    """Work to do for one user: ``message_id`` names the task (``welcome``,
    ``trial-reminder``), so each user has at most one live message of each kind."""

    user_id = models.BigIntegerField()
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("user_id", "message_id")

    class Meta:
        verbose_name_plural = "user tasks"
