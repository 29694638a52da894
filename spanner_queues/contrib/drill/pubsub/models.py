"""The Pub/Sub drill's two services. Service A: ``DrillEvent``, relayed to the topic
``TOPIC`` (a message Pub/Sub refuses goes to ``DrillEventDead``). Service B: ``DrillInbox``,
pulling the subscription ``SUBSCRIPTION`` on that topic; its receiver writes the drill's
``DrillEffect`` row of the event's key in the transaction that acks the inbox message.

The ordered drill's (``queuedrill --pubsub --ordered``) are the same two services ordered per
stream: ``DrillOrderedEvent`` (``ordered_by`` the stream, relayed to ``ORDERED_TOPIC`` with the
stream as the Pub/Sub ordering key; ``DrillOrderedEventDead``) and the ordered inbox
``DrillOrderedInbox`` (keyed by the ordering key and the event id, ``ordered_by`` the ordering
key), pulling ``ORDERED_SUBSCRIPTION``, which has message ordering on."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import JSONPayloadField, Queue

#: the drill's topic and subscription ids, in the configured project
TOPIC = "sq-drill-events"
SUBSCRIPTION = "sq-drill-inbox"
#: the ordered drill's (``--pubsub --ordered``)
ORDERED_TOPIC = "sq-drill-ordered-events"
ORDERED_SUBSCRIPTION = "sq-drill-ordered-inbox"


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


class DrillOrderedEvent(Queue):
    """Service A's ordered outbox (``queuedrill --pubsub --ordered``): each stream's events one
    at a time in send order, relayed with the stream as their ordering key. The message id is
    drawn at random: the order is the send order, never the key's."""

    stream = models.CharField(max_length=32)
    message_id = models.CharField(max_length=32)
    pk = models.CompositePrimaryKey("stream", "message_id")
    payload = JSONPayloadField()

    class Meta:
        db_table = "sq_drill_ordered_events"

    class QueueMeta:
        pubsub_topic = ORDERED_TOPIC
        ordered_by = ("stream",)
        dead_letter_queue = "spanner_queues_drill_pubsub.DrillOrderedEventDead"


class DrillOrderedEventDead(Queue):
    """Ordered events Pub/Sub refused for good (none in a drill: one here is reported)."""

    stream = models.CharField(max_length=32)
    message_id = models.CharField(max_length=32)
    pk = models.CompositePrimaryKey("stream", "message_id")
    payload = JSONPayloadField()

    class Meta:
        db_table = "sq_drill_ordered_events_dead"


class DrillOrderedInbox(Queue):
    """Service B's ordered inbox: each event taken in once under its Pub/Sub ordering key (the
    stream) and its event id; a stream's events run one at a time, in the order taken in."""

    ordering_key = models.CharField(max_length=64)
    event_id = models.CharField(max_length=128)
    pk = models.CompositePrimaryKey("ordering_key", "event_id")
    payload = JSONPayloadField()

    class Meta:
        db_table = "sq_drill_ordered_inbox"

    class QueueMeta:
        pubsub_subscription = ORDERED_SUBSCRIPTION
        ordered_by = ("ordering_key",)
