"""Products, orders, payments, and the shop's two queues."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from spanner_queues.models import Queue


class Product(models.Model):
    sku = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    price_cents = models.PositiveIntegerField()
    stock = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.name


class Order(models.Model):
    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    product = models.ForeignKey(Product, on_delete=models.PROTECT)
    quantity = models.PositiveIntegerField(default=1)
    amount_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    inventory_reserved_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    fulfilment_started_at = models.DateTimeField(null=True, blank=True)
    shipped_at = models.DateTimeField(null=True, blank=True)
    tracking_number = models.CharField(max_length=32, blank=True)
    needs_attention = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"order {self.pk}"

    @property
    def status(self) -> str:
        if self.shipped_at:
            return "shipped"
        if self.fulfilment_started_at:
            return "booking shipment"
        if self.needs_attention:
            return "stuck"
        done = [n for n, t in (("stock", self.inventory_reserved_at), ("paid", self.paid_at)) if t]
        return "+".join(done) or "new"


class Payment(models.Model):
    """The ledger: one row per captured payment. Written exactly once per order, with the
    ack of the message that asked for it (pattern 13)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="payments")
    amount_cents = models.PositiveIntegerField()
    captured_at = models.DateTimeField(auto_now_add=True)
    reference = models.CharField(max_length=100)

    def __str__(self) -> str:
        return f"{self.amount_cents / 100:.2f} for {self.order}"


class CarrierBooking(models.Model):
    """The fake carrier's own records (stands in for an external API that deduplicates
    requests by idempotency key)."""

    idempotency_key = models.CharField(max_length=100, unique=True)
    tracking_number = models.CharField(max_length=32)
    booked_at = models.DateTimeField(auto_now_add=True)


class OrderTasks(Queue):
    """Pattern 11 (polymorphic queue): one queue, one receiver per ``kind`` (a key column).
    ``order_id`` comes first so keys spread over Spanner splits; all kinds are quick (slow
    work such as reports has its own queue, so it cannot starve these)."""

    order_id = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    pk = models.CompositePrimaryKey("order_id", "kind")

    class QueueMeta:
        max_attempts = 10
        dead_letter_queue = "shop.OrderTasksDead"

    class Meta:
        verbose_name_plural = "order tasks"


class OrderTasksDead(Queue):
    """Order tasks that failed ``max_attempts`` times (replay them from the admin)."""

    order_id = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    pk = models.CompositePrimaryKey("order_id", "kind")

    class Meta:
        verbose_name_plural = "order tasks (dead letters)"


class OrderChecks(Queue):
    """Pattern 6 (join): inventory and payment each send one message here when they are done;
    the receiver starts the shipment once both are."""

    order_id = models.BigIntegerField()
    event = models.CharField(max_length=32)
    pk = models.CompositePrimaryKey("order_id", "event")
