"""Three soak queues (keys reused after their ack) and one effect row per committed run.

Each send carries a ``send_id`` unique to it; the receiver writes one ``SoakEffect`` in its
transaction, which also acks the message. After the drain every ``send_id`` must have exactly
one row: none is a lost message, two a message whose work committed twice."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import Queue


class SoakA(Queue):
    id = models.CharField(max_length=64, primary_key=True)

    class QueueMeta:
        payload_type = "json"


class SoakB(Queue):
    id = models.CharField(max_length=64, primary_key=True)

    class QueueMeta:
        payload_type = "json"


class SoakC(Queue):
    id = models.CharField(max_length=64, primary_key=True)

    class QueueMeta:
        payload_type = "json"


class SoakEffect(models.Model):
    send_id = models.CharField(max_length=64)
    queue = models.CharField(max_length=32)
    key = models.CharField(max_length=64)
    attempt = models.IntegerField(default=0)
    #: ``time.time()`` of the send (the sender's) and of this run (the worker's: one machine)
    sent_at = models.FloatField(default=0.0)
    handled_at = models.FloatField(default=0.0)
    pid = models.IntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["send_id"], name="soak_effect_send")]
