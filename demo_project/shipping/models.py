"""Service "orders" (the shop) and service "shipping", connected by Pub/Sub.

``OrderPlacedEvents`` is the shop's outbox: a placed order's event is sent in the transaction
that creates the order (``outbox.register`` in ``apps.py``), and ``runqueueworker`` relays it to
the topic ``orders``. ``ShippingInbox`` is the shipping service's inbox on the subscription
``orders-shipping``: each event is taken in once (a copy Pub/Sub delivers again is dropped),
and its receiver writes one ``PackingSlip`` in the transaction that acks it. In production the
two services are two projects with two databases; here they share the demo's."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import JSONPayloadField, Queue


class OrderPlacedEvents(Queue):
    """The orders service's outbox, relayed to Pub/Sub."""

    order = models.BigIntegerField()
    message_id = models.CharField(max_length=2000)
    pk = models.CompositePrimaryKey("order", "message_id")
    payload = JSONPayloadField()

    class QueueMeta:
        pubsub_topic = "orders"
        dead_letter_queue = "shipping.OrderPlacedEventsDead"

    class Meta:
        verbose_name_plural = "order placed events (relayed to Pub/Sub)"


class OrderPlacedEventsDead(Queue):
    """Events Pub/Sub refused for good (too large, bad attributes)."""

    order = models.BigIntegerField()
    message_id = models.CharField(max_length=2000)
    pk = models.CompositePrimaryKey("order", "message_id")
    payload = JSONPayloadField()

    class Meta:
        verbose_name_plural = "order placed events (dead letters)"


class ShippingInbox(Queue):
    """The shipping service's inbox: one message per order event, keyed by its event id."""

    event_id = models.CharField(max_length=128, primary_key=True)
    payload = JSONPayloadField()

    class QueueMeta:
        pubsub_subscription = "orders-shipping"

    class Meta:
        verbose_name_plural = "shipping inbox (from Pub/Sub)"


class PackingSlip(models.Model):
    """The shipping service's work: one slip per order, whatever Pub/Sub delivers twice."""

    order_id = models.BigIntegerField()
    event_id = models.CharField(max_length=128)
    prepared_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"packing slip for order {self.order_id}"
