"""``SeenEvent``: the event ids an inbox took in, kept for ``DEDUP_WINDOW_DAYS``;
``RelayedEvent``: the relay's archive of published events, kept for ``ARCHIVE_DAYS`` (replays);
``AcceptedReplay``: the replays an inbox takes in again."""

from __future__ import annotations

import hashlib

from django.db import models


def seen_id(inbox: str, event_id: str, replay_id: str = "") -> str:
    """The row id of ``event_id`` taken in by the inbox queue labelled ``inbox``; with a
    ``replay_id``, of its copy replayed by that replay (an accepted replay's own seen row)."""
    text = f"{inbox}\0{event_id}" + (f"\0{replay_id}" if replay_id else "")
    return hashlib.sha256(text.encode()).hexdigest()


def accepted_replay_id(inbox: str, replay_id: str) -> str:
    """The row id of ``AcceptedReplay`` for replay ``replay_id`` into inbox ``inbox``."""
    return hashlib.sha256(f"{inbox}\0{replay_id}".encode()).hexdigest()


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


class RelayedEvent(models.Model):
    """One event the relay published, kept ``ARCHIVE_DAYS`` for replays (``pubsubreplay``):
    written in the transaction that acks its message once Pub/Sub confirmed it, so an event is
    archived if and only if its ack committed. Pruned by the relay past the window; on Spanner a
    row deletion policy also expires rows 7 days after ``published_at``."""

    #: random (a run's random part, then the row's place): two sends of one key and payload
    #: share an event id but are two rows
    id = models.CharField(primary_key=True, max_length=32)
    #: the queue's label (the ``queue`` attribute)
    queue = models.CharField(max_length=200)
    #: not indexed: event ids are random, and an index of them cost every batch a random page
    #: per event (the relay at 0.8 of a drainer on SQLite with 80,000 rows archived, 1.0
    #: without); ``pubsubreplay --event-id`` reads the queue's events in its window, as
    #: ``--key`` does
    event_id = models.CharField(max_length=255)
    #: the ``key`` attribute: the message key as a JSON array
    key = models.TextField()
    ordering_key = models.CharField(max_length=1024, blank=True, default="")
    #: the published data (the stored payload)
    data = models.BinaryField()
    published_at = models.DateTimeField()

    class Meta:
        verbose_name = "relayed Pub/Sub event"
        indexes = [models.Index(fields=["queue", "published_at"], name="sq_pubsub_archive_time")]

    def __str__(self) -> str:
        return f"{self.queue}: {self.event_id}"


class AcceptedReplay(models.Model):
    """A replay an inbox takes in again (``pubsubacceptreplay``): its replayed copies of events
    it already took in are taken in once more, each once (its own seen row); without this row
    they are duplicates like any redelivery."""

    #: ``accepted_replay_id(inbox, replay_id)``
    id = models.CharField(primary_key=True, max_length=64)
    inbox = models.CharField(max_length=200)
    replay_id = models.CharField(max_length=100)
    accepted_at = models.DateTimeField()

    class Meta:
        verbose_name = "accepted Pub/Sub replay"

    def __str__(self) -> str:
        return f"{self.inbox}: {self.replay_id}"
