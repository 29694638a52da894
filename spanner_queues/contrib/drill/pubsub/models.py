"""The Pub/Sub drill's two services. Service A: ``DrillEvent``, relayed to the topic
``TOPIC`` (a message Pub/Sub refuses goes to ``DrillEventDead``). Service B: ``DrillInbox``,
pulling the subscription ``SUBSCRIPTION`` on that topic; its receiver writes the drill's
``DrillEffect`` row of the event's key in the transaction that acks the inbox message."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import JSONPayloadField, Queue

#: the drill's topic and subscription ids, in the configured project
TOPIC = "sq-drill-events"
SUBSCRIPTION = "sq-drill-inbox"


class DrillEvent(Queue):
    """Service A's outbox: only ``queuedrill --pubsub`` sends to it; the relay publishes it."""

    id = models.CharField(max_length=64, primary_key=True)
    payload = JSONPayloadField()

    class Meta:
        db_table = "sq_drill_events"

    class QueueMeta:
        pubsub_topic = TOPIC
        dead_letter_queue = "spanner_queues_drill_pubsub.DrillEventDead"


class DrillEventDead(Queue):
    """Events Pub/Sub refused for good (none in a drill: one here is reported)."""

    id = models.CharField(max_length=64, primary_key=True)
    payload = JSONPayloadField()

    class Meta:
        db_table = "sq_drill_events_dead"


class DrillInbox(Queue):
    """Service B's inbox: each event taken in once, keyed by its event id."""

    event_id = models.CharField(max_length=128, primary_key=True)
    payload = JSONPayloadField()

    class Meta:
        db_table = "sq_drill_inbox"

    class QueueMeta:
        pubsub_subscription = SUBSCRIPTION
