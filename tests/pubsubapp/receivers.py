from __future__ import annotations

from spanner_queues import receiver
from spanner_queues.message import Message
from tests.pubsubapp.models import BillingInbox, Charge


@receiver(BillingInbox)
def charge(message: Message) -> None:
    """Service B's work: one charge per order event, in the transaction that acks it."""
    Charge.objects.create(order_pk=message.json()["pk"], event_id=message.key[0])
