"""Dead-letter queues. Spanner has none; a queue declares one in ``QueueMeta``:

    class UserTasks(Queue):
        ...
        class QueueMeta:
            max_attempts = 5
            dead_letter_queue = "myapp.UserTasksDead"   # same key field names as UserTasks

``dead_letter(message)`` acks the message and sends it, same key and payload, to the
dead-letter queue in one transaction (``api.requeue``); ``replay(message)`` does the reverse.
When a message is dead-lettered is decided by the worker (``worker.decide``) and written by
its delivery policy (``worker.apply``), on the plan's engine, not through this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spanner_queues.api import requeue
from spanner_queues.exceptions import QueueConfigurationError, UnknownQueue
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.queues import get_queue, queue_models

if TYPE_CHECKING:
    from spanner_queues.models import Queue


__all__ = ["dead_letter", "dead_letter_queue_for", "replay", "sources_of"]


def dead_letter_queue_for(queue: str | type[Queue]) -> type[Queue] | None:
    """The dead-letter queue declared for ``queue``, or None."""
    label = queue_options(get_queue(queue)).dead_letter_queue
    return get_queue(label) if label else None


def sources_of(dead_letter_queue: str | type[Queue]) -> list[type[Queue]]:
    """The queues that declare ``dead_letter_queue`` as theirs."""
    target = get_queue(dead_letter_queue)._meta.label_lower
    return [
        m for m in queue_models() if (queue_options(m).dead_letter_queue or "").lower() == target
    ]


def dead_letter(message: Message, *, using: str | None = None) -> Message:
    """Move ``message`` to its queue's dead-letter queue (ack + send, one transaction)."""
    source = get_queue(message.queue)
    target = dead_letter_queue_for(source)
    if target is None:
        raise QueueConfigurationError(f"{source._meta.label} declares no dead_letter_queue.")
    return requeue(message, to=target, using=using)


def replay(message: Message, *, using: str | None = None) -> Message:
    """Send a dead-lettered message back to the queue it came from (ack + send)."""
    dead = get_queue(message.queue)
    sources = sources_of(dead)
    if len(sources) != 1:
        raise UnknownQueue(
            f"{dead._meta.label} is the dead-letter queue of {len(sources)} queues; "
            "replay needs exactly one."
        )
    return requeue(message, to=sources[0], using=using)
