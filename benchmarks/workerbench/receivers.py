"""The no-op receiver (atomic: the ack is the only write of its transaction)."""

from __future__ import annotations

from benchmarks.workerbench import trace
from benchmarks.workerbench.models import OrderBatches, OrderTasks
from spanner_queues import receiver
from spanner_queues.message import Message


@receiver(OrderTasks)
def noop(message: Message) -> None:
    trace.started(message.key[0])


@receiver(OrderBatches, batch=True, max_batch_size=100)
def noop_batch(messages: list[Message]) -> None:
    for message in messages:
        trace.started(message.key[0])
