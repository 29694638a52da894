"""Replays: archived events (``RelayedEvent``) published again to their queue's topic, with
their original data, event id, key and ordering key, and a ``replay_id`` attribute naming the
replay; ``manage.py pubsubreplay`` and the admin's action. An inbox drops them as duplicates
unless it accepts that replay (``AcceptedReplay``, ``manage.py pubsubacceptreplay``): then it
takes each replayed event in once more, and once only."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime

from django.db.models import Q, QuerySet

from spanner_queues import clock
from spanner_queues.contrib.pubsub.conf import pubsub_params, resource_path
from spanner_queues.contrib.pubsub.models import RelayedEvent
from spanner_queues.contrib.pubsub.publish import Outgoing
from spanner_queues.contrib.pubsub.relay import (
    EVENT_ID_ATTRIBUTE,
    KEY_ATTRIBUTE,
    QUEUE_ATTRIBUTE,
    REPLAY_ID_ATTRIBUTE,
    publisher,
)
from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.options import queue_options
from spanner_queues.queues import get_queue

#: archived events one replay batch publishes and waits for
REPLAY_BATCH = 500


class ReplayFailed(Exception):
    """Pub/Sub did not confirm a replayed event: the replay stopped after ``done`` events."""

    def __init__(self, message: str, done: int) -> None:
        super().__init__(message)
        self.done = done


def new_replay_id() -> str:
    """A fresh replay id: the time (UTC) and a random part."""
    return f"replay-{clock.now():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def topic_of(queue: str) -> str:
    """The topic path of the relayed queue labelled ``queue``."""
    topic = queue_options(get_queue(queue)).pubsub_topic
    if topic is None:
        raise QueueConfigurationError(f"{queue} is not relayed (no QueueMeta.pubsub_topic).")
    return resource_path("topics", str(topic), pubsub_params())


def batches(events: QuerySet[RelayedEvent], size: int) -> Iterator[list[RelayedEvent]]:
    """``events`` in publish order (``published_at``, then id), ``size`` at a time, each batch
    read after the one before was replayed (keyset pages: no offset scans)."""
    events = events.order_by("published_at", "id")
    last: tuple[datetime, str] | None = None
    while True:
        page = events
        if last is not None:
            at, pk = last
            page = page.filter(Q(published_at__gt=at) | Q(published_at=at, id__gt=pk))
        batch = list(page[:size])
        if not batch:
            return
        yield batch
        last = (batch[-1].published_at, batch[-1].id)


def replay(
    events: QuerySet[RelayedEvent],
    replay_id: str,
    *,
    batch_size: int = REPLAY_BATCH,
    timeout: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Publish ``events`` again to their queues' topics, in publish order, ``batch_size`` at a
    time (each batch confirmed by Pub/Sub before the next is read), each with its original
    data, attributes and ordering key plus ``replay_id``; ``progress(done)`` after each batch.
    Returns how many were published; ``ReplayFailed`` at the first one not confirmed."""
    client = publisher()
    timeout = timeout if timeout is not None else pubsub_params().publish_timeout
    topics: dict[str, str] = {}
    done = 0
    for batch in batches(events, batch_size):
        outgoing = []
        for event in batch:
            if event.queue not in topics:
                topics[event.queue] = topic_of(event.queue)
            attributes = {
                EVENT_ID_ATTRIBUTE: event.event_id,
                QUEUE_ATTRIBUTE: event.queue,
                KEY_ATTRIBUTE: event.key,
                REPLAY_ID_ATTRIBUTE: replay_id,
            }
            outgoing.append(
                Outgoing(topics[event.queue], bytes(event.data), event.ordering_key, attributes)
            )
        outcomes = client.publish(outgoing, time.monotonic() + timeout)
        for event, error in zip(batch, outcomes, strict=True):
            if error is not None:
                raise ReplayFailed(
                    f"event {event.event_id} of {event.queue} not confirmed by Pub/Sub "
                    f"({type(error).__name__}: {error}); {done} replayed before it",
                    done,
                ) from error
            done += 1
        if progress is not None:
            progress(done)
    return done
