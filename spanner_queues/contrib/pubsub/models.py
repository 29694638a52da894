"""``SeenEvent``: the event ids an inbox took in, kept for ``DEDUP_WINDOW_DAYS``."""

from __future__ import annotations

import hashlib

from django.db import models


def seen_id(inbox: str, event_id: str) -> str:
    """The row id of ``event_id`` taken in by the inbox queue labelled ``inbox``."""
    return hashlib.sha256(f"{inbox}\0{event_id}".encode()).hexdigest()


class SeenEvent(models.Model):
    """One event taken into an inbox queue. Written in the transaction that sends the inbox
    message; a pulled copy whose row exists is dropped. On Spanner a row deletion policy
    expires rows 7 days (Pub/Sub's longest retention) after ``seen_at``; every database is
    also pruned by the pullers to ``DEDUP_WINDOW_DAYS``."""

    #: ``seen_id(inbox, event_id)``: one id column, the same on every database
    id = models.CharField(primary_key=True, max_length=64)
    inbox = models.CharField(max_length=200)
    event_id = models.CharField(max_length=255)
    seen_at = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name = "seen Pub/Sub event"

    def __str__(self) -> str:
        return f"{self.inbox}: {self.event_id}"
