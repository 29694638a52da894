"""The shop's receivers: a polymorphic task queue and a join.

``OrderTasks`` has one receiver per ``kind`` (``match=`` on a key column, pattern 11):

- ``reserve_inventory`` and ``capture_payment`` update the order and send to ``OrderChecks``, in
  the transaction that acks their task (atomic receivers);
- ``book_shipment`` calls the rate-limited carrier; a 429 becomes ``Retry(after=Retry-After)``
  (pattern 12).
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from demo_project.notifications.services import notify
from demo_project.shop.carrier import RateLimited, carrier
from demo_project.shop.models import Order, OrderChecks, OrderTasks, Payment, Product
from spanner_queues import Retry, receiver
from spanner_queues.message import Message
from spanner_queues.patterns import resend_later

#: while an order waits for its other half, look again this often...
RECHECK = timedelta(seconds=10)
#: ...and give up (flag the order for a person) after this long
JOIN_TIMEOUT = timedelta(hours=1)
#: an out-of-stock reservation is tried again after this long
OUT_OF_STOCK_RETRY = timedelta(seconds=20)


def _order(message: Message) -> Order:
    return Order.objects.select_for_update().get(pk=message.key_dict["order_id"])


@receiver(OrderTasks, match={"kind": "reserve_inventory"})
def reserve_inventory(message: Message) -> None:
    order = _order(message)
    if order.inventory_reserved_at:
        return
    taken = Product.objects.filter(pk=order.product_id, stock__gte=order.quantity).update(
        stock=F("stock") - order.quantity
    )
    if not taken:
        raise Retry(after=OUT_OF_STOCK_RETRY, reason=f"{order.product} is out of stock")
    order.inventory_reserved_at = timezone.now()
    order.save(update_fields=["inventory_reserved_at"])
    OrderChecks.send(order_id=order.pk, event="inventory_reserved")


@receiver(OrderTasks, match={"kind": "capture_payment"})
def capture_payment(message: Message) -> None:
    """Pattern 13 (exactly-once processing): the ledger row, the order update, the check
    message and the ack commit together. If another delivery of this message acked first (its
    lease had expired), the ack raises ``MessageAlreadyAcked`` and all of it rolls back: the
    payment is captured once."""
    order = _order(message)
    Payment.objects.create(order=order, amount_cents=order.amount_cents, reference=str(message))
    order.paid_at = timezone.now()
    order.save(update_fields=["paid_at"])
    OrderChecks.send(order_id=order.pk, event="payment_captured")


@receiver(OrderTasks, match={"kind": "book_shipment"}, atomic=False)
def book_shipment(message: Message) -> None:
    """Pattern 12 (custom retry delay). The carrier is external, so this receiver is not
    atomic: call it first (the message key is the idempotency key), then record the result;
    the worker acks afterwards."""
    order = Order.objects.get(pk=message.key_dict["order_id"])
    try:
        tracking = carrier.book(idempotency_key=f"{message.queue}:{order.pk}")
    except RateLimited as exc:
        # The worker acks this message and sends it again, same key, due after Retry-After.
        raise Retry(after=exc.retry_after, reason=str(exc)) from exc
    with transaction.atomic():
        Order.objects.filter(pk=order.pk).update(
            tracking_number=tracking, shipped_at=timezone.now()
        )
        notify(order.customer_id, f"Order {order.pk} has shipped (tracking {tracking}).")


@receiver(OrderChecks)
def check_order(message: Message) -> None:
    """Pattern 6 (join): ship once both inventory and payment are confirmed, otherwise look
    again later. Each half sends its own check, so the second one normally starts the
    shipment; the re-queue is the watchdog for a half that never comes."""
    order = _order(message)
    if order.fulfilment_started_at or order.needs_attention:
        return  # the other check got here first
    if order.inventory_reserved_at and order.paid_at:
        order.fulfilment_started_at = timezone.now()
        order.save(update_fields=["fulfilment_started_at"])
        OrderTasks.send(order_id=order.pk, kind="book_shipment")
        notify(order.customer_id, f"Order {order.pk} is paid and packed.")
        return
    if timezone.now() - order.created_at > JOIN_TIMEOUT:
        order.needs_attention = True
        order.save(update_fields=["needs_attention"])
        return
    resend_later(message, after=RECHECK)  # ack + send again, same key, one transaction
