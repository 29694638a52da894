"""The no-op receiver (atomic: the ack is the only write of its transaction)."""

from __future__ import annotations

from benchmarks.workerbench import trace
from benchmarks.workerbench.models import OrderTasks
from spanner_queues import receiver
from spanner_queues.message import Message


@receiver(OrderTasks)
def noop(message: Message) -> None:
    trace.started(message.key[0])
