"""The search index and its dirty flags."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import Queue


class SearchEntry(models.Model):
    """What the site search finds for one user (recomputed, never edited)."""

    user_id = models.BigIntegerField(primary_key=True)
    text = models.TextField()
    indexed_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "search entries"

    def __str__(self) -> str:
        return self.text[:60]


class ReindexQueue(Queue):
    """Pattern 9 (dirty flag): the message *is* the flag. One key per user, so a burst of
    edits leaves at most one message to process."""

    user_id = models.BigIntegerField(primary_key=True)
