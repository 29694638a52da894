"""The drill's queue and the effects its receiver writes.

A drill message's key is ``<run>-<n>``; each run of the receiver that commits leaves exactly
one ``DrillEffect`` row, written in the receiver's transaction (which also acks the message).
Counting rows per key after the drain measures what was handled, what was lost (no row) and what
was handled twice (more than one row): a second row can only exist if a message's work committed
twice.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models

from spanner_queues import clock
from spanner_queues.models import Queue


def _now() -> datetime:  # a model default (migrations serialise it)
    return clock.now()


class DrillMessage(Queue):
    """The drill queue. Only ``queuedrill`` sends to it; its workers receive only from it."""

    id = models.CharField(max_length=64, primary_key=True)

    class Meta:
        db_table = "sq_drill_messages"

    class QueueMeta:
        payload_type = "json"


class DrillOrdered(Queue):
    """The ordered drill's queue (``queuedrill --ordered``): each stream's messages one at a
    time in send order (``QueueMeta.ordered_by``). The message id is drawn at random: the
    order is the send order, never the key's."""

    stream = models.CharField(max_length=32)
    message_id = models.CharField(max_length=32)
    pk = models.CompositePrimaryKey("stream", "message_id")

    class Meta:
        db_table = "sq_drill_ordered"

    class QueueMeta:
        payload_type = "json"
        ordered_by = ("stream",)


class DrillEffect(models.Model):
    """One committed run of the drill receiver."""

    run = models.CharField(max_length=32)
    key = models.CharField(max_length=64)
    #: ``host-pid`` of the worker process that ran the receiver.
    worker = models.CharField(max_length=128)
    attempt = models.IntegerField(default=0)
    #: the worker process's transaction retries so far (``transactions.retry_counts()``).
    retries = models.IntegerField(default=0)
    handled_at = models.DateTimeField(default=_now)
    #: ``--ordered``: the message's number in its stream (1, 2, ...), and the highest number
    #: of its stream whose effect had committed when this one's transaction read it: ``seq -
    #: 1`` when the stream ran in order, one at a time
    seq = models.IntegerField(null=True)
    after = models.IntegerField(null=True)

    class Meta:
        db_table = "sq_drill_effects"
        indexes = [models.Index(fields=["run", "key"], name="sq_drill_effect_run_key")]

    def __str__(self) -> str:
        return f"{self.key} by {self.worker}"
