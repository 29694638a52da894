"""Service B's receivers of the Pub/Sub drill (the drill's ``handle_drill_message``: optional work,
then one ``DrillEffect`` row keyed by the event's drill key, in the transaction that acks the
inbox message; the ordered drill's ``handle_ordered_inbox_event``, its stream the event's
Pub/Sub ordering key as the ordered inbox took it in), and the counters the drill reads back
from its workers' logs: events published by the relay and duplicates dropped by the inbox, and
the faults they felt: publishes the relay gave back (not confirmed) and the inbox's failed
pulls (one ``MARKER`` line per signal).

Registered only in the drill's own worker processes (``SQ_DRILL_WORKER``, as the drill's)."""

from __future__ import annotations

import os
import sys
from typing import Any

from spanner_queues import receiver
from spanner_queues.contrib.drill.pubsub.models import (
    DrillEvent,
    DrillInbox,
    DrillOrderedEvent,
    DrillOrderedInbox,
)
from spanner_queues.contrib.drill.receivers import write_effect, write_ordered_effect
from spanner_queues.message import Message
from spanner_queues.signals import (
    inbox_duplicates_dropped,
    inbox_pull_failed,
    messages_published,
    publish_failed,
)

#: the start of a counter line in a drill worker's output: ``MARKER <name> <count>``
MARKER = "sq-drill-count"


def handle_inbox_event(message: Message) -> None:
    spec = message.json() or {}
    write_effect(spec, str(spec.get("key", "")), message, DrillInbox)


def handle_ordered_inbox_event(message: Message) -> None:
    """The ordered drill's effect: its stream is the inbox message's ordering key (what the
    relay published it under and the inbox took it in by), its number in the payload."""
    write_ordered_effect(message.json() or {}, str(message.key[0]), message, DrillOrderedInbox)


def _count(name: str, count: int) -> None:
    sys.stderr.write(f"{MARKER} {name} {count}\n")
    sys.stderr.flush()


def _published(sender: Any, messages: Any = (), **kwargs: Any) -> None:
    if sender in (DrillEvent, DrillOrderedEvent):
        _count("published", len(messages))


def _dropped(sender: Any, count: int = 0, **kwargs: Any) -> None:
    if sender in (DrillInbox, DrillOrderedInbox):
        _count("duplicates", count)


def _publish_failed(sender: Any, messages: Any = (), refused: bool = False, **kwargs: Any) -> None:
    if sender in (DrillEvent, DrillOrderedEvent) and not refused:  # given back, not refused
        _count("publish_failed", len(messages))


def _pull_failed(sender: Any, **kwargs: Any) -> None:
    if sender in (DrillInbox, DrillOrderedInbox):
        _count("pull_failed", 1)


if os.environ.get("SQ_DRILL_WORKER"):
    receiver(DrillInbox)(handle_inbox_event)
    receiver(DrillOrderedInbox)(handle_ordered_inbox_event)
    messages_published.connect(_published, weak=False)
    inbox_duplicates_dropped.connect(_dropped, weak=False)
    publish_failed.connect(_publish_failed, weak=False)
    inbox_pull_failed.connect(_pull_failed, weak=False)
