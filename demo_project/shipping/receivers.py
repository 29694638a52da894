"""The shipping service's receiver: one packing slip per order event, in the transaction that
acks the inbox message (so the slip and the ack commit together)."""

from __future__ import annotations

from demo_project.shipping.models import PackingSlip, ShippingInbox
from spanner_queues import receiver
from spanner_queues.message import Message


@receiver(ShippingInbox)
def prepare_packing_slip(message: Message) -> None:
    PackingSlip.objects.create(order_id=message.json()["pk"], event_id=message.key[0])
