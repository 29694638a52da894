"""Service B's receiver of the Pub/Sub drill (the drill's ``handle_drill_message``: optional
work, then one ``DrillEffect`` row keyed by the event's drill key, in the transaction that acks
the inbox message), and two counters the drill reads back from its workers' logs: events
published by the relay and duplicates dropped by the inbox (one ``MARKER`` line per signal).

Registered only in the drill's own worker processes (``SQ_DRILL_WORKER``, as the drill's)."""

from __future__ import annotations

import os
import sys
from typing import Any

from spanner_queues import receiver
from spanner_queues.contrib.drill.pubsub.models import DrillEvent, DrillInbox
from spanner_queues.contrib.drill.receivers import write_effect
from spanner_queues.message import Message
from spanner_queues.signals import inbox_duplicates_dropped, messages_published

#: the start of a counter line in a drill worker's output: ``MARKER <name> <count>``
MARKER = "sq-drill-count"


def handle_inbox_event(message: Message) -> None:
    spec = message.json() or {}
    write_effect(spec, str(spec.get("key", "")), message, DrillInbox)


def _count(name: str, count: int) -> None:
    sys.stderr.write(f"{MARKER} {name} {count}\n")
    sys.stderr.flush()


def _published(sender: Any, messages: Any = (), **kwargs: Any) -> None:
    if sender is DrillEvent:
        _count("published", len(messages))


def _dropped(sender: Any, count: int = 0, **kwargs: Any) -> None:
    if sender is DrillInbox:
        _count("duplicates", count)


if os.environ.get("SQ_DRILL_WORKER"):
    receiver(DrillInbox)(handle_inbox_event)
    messages_published.connect(_published, weak=False)
    inbox_duplicates_dropped.connect(_dropped, weak=False)
