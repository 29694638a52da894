"""Service A: ``Order``, whose creation sends an event to ``OrderEvents``, relayed to the topic
``orders``. Service B: ``BillingInbox`` pulls the subscription ``orders-billing``; its receiver
writes one ``Charge`` per event (no unique constraint: a duplicate would show);
``OrderedBillingInbox`` pulls ``orders-billing-ordered`` (on the same topic), ordered per Pub/Sub
ordering key."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import JSONPayloadField, Queue


class Order(models.Model):
    amount = models.IntegerField(default=0)


class OrderEvents(Queue):
    order = models.BigIntegerField()
    message_id = models.CharField(max_length=2000)
    pk = models.CompositePrimaryKey("order", "message_id")
    payload = JSONPayloadField()

    class QueueMeta:
        pubsub_topic = "orders"
        dead_letter_queue = "pubsubapp.OrderEventsDead"


class OrderedOrderEvents(Queue):
    """``OrderEvents`` ordered per order (``QueueMeta.ordered_by``): an order's events reach the
    topic one at a time, in send order, under the order's Pub/Sub ordering key."""

    order = models.BigIntegerField()
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("order", "message_id")
    payload = JSONPayloadField()

    class QueueMeta:
        pubsub_topic = "orders"
        ordered_by = ("order",)
        dead_letter_queue = "pubsubapp.OrderEventsDead"


class OrderEventsDead(Queue):
    order = models.BigIntegerField()
    message_id = models.CharField(max_length=2000)
    pk = models.CompositePrimaryKey("order", "message_id")
    payload = JSONPayloadField()


class BillingInbox(Queue):
    event_id = models.CharField(max_length=128, primary_key=True)
    payload = JSONPayloadField()

    class QueueMeta:
        pubsub_subscription = "orders-billing"


class OrderedBillingInbox(Queue):
    """An ordered inbox (``ordered_by`` its first key field): each event keyed by its Pub/Sub
    ordering key and its event id, a key's events run one at a time in publish order."""

    ordering_key = models.CharField(max_length=1024)
    event_id = models.CharField(max_length=128)
    pk = models.CompositePrimaryKey("ordering_key", "event_id")
    payload = JSONPayloadField()

    class QueueMeta:
        pubsub_subscription = "orders-billing-ordered"
        ordered_by = ("ordering_key",)


class WideKeyQueue(Queue):
    """A queue keyed by a string wider than ``SeenEvent.event_id`` (255): an inbox puller
    on it must refuse longer event ids itself (tests/pubsub/test_inbox.py)."""

    event_id = models.CharField(max_length=512, primary_key=True)
    payload = JSONPayloadField()


class Charge(models.Model):
    order_pk = models.BigIntegerField()
    event_id = models.CharField(max_length=128)
