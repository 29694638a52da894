"""The inbox: ``InboxPuller``, a thread ``runqueueworker`` runs beside its worker for each
inbox queue it serves (``QueueMeta.pubsub_subscription``; the app's
``AppConfig.worker_services``).

Each pull takes up to ``PULL_MAX_MESSAGES`` Pub/Sub messages and, in one transaction on the
queue's database, records each new event id in ``SeenEvent`` and sends it as a message of the
inbox queue (key: the event id; payload: the Pub/Sub data), dropping those whose id is recorded
already; only after that transaction commits are the Pub/Sub messages acked. So a crash before
the commit leaves them to Pub/Sub's redelivery, and a crash after it leaves copies whose id is
recorded: taken in once. The event id is the relay's ``event_id`` attribute, else (a publisher
of another kind) the Pub/Sub message id. A message whose data the queue cannot hold (a JSON
inbox and data that is not JSON) is not acked: Pub/Sub delivers it again, and a dead-letter
policy on the subscription ends that. Ids are pruned past ``DEDUP_WINDOW_DAYS`` (at most once
an hour per puller, in bounded deletes), and on Spanner also expired by a row deletion policy.

An ordered inbox (``QueueMeta.ordered_by``; its key: the ordering key, then the event id) keys
each message by its Pub/Sub ordering key too ("" for a message without one). A pull's events
are sent in the order Pub/Sub delivered them, and on a subscription with message ordering on
Pub/Sub delivers a key's next messages only once the earlier ones were acked (after the commit
that took them in), so each key's messages reach the queue in publish order, and its receiver
runs them so (the ordered queue's promise). A message the inbox cannot hold leaves the later
messages of its key in that pull unacked too: taken in, they would run before it.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
from django.db import IntegrityError, connections
from google.api_core import exceptions as google_exceptions
from google.cloud.pubsub_v1 import SubscriberClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from spanner_queues import api, clock
from spanner_queues.contrib.pubsub.conf import (
    MAX_ORDERING_KEY_BYTES,
    PubSubParams,
    inbox_key,
    pubsub_params,
    resource_path,
)
from spanner_queues.contrib.pubsub.models import (
    AcceptedReplay,
    SeenEvent,
    accepted_replay_id,
    seen_id,
)
from spanner_queues.contrib.pubsub.relay import EVENT_ID_ATTRIBUTE, REPLAY_ID_ATTRIBUTE
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import MessageAlreadyExists, PayloadError
from spanner_queues.options import queue_options
from spanner_queues.signals import inbox_duplicates_dropped, inbox_pull_failed, inbox_pulled
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from spanner_queues.models import Queue

logger = logging.getLogger("spanner_queues.pubsub")

#: the longest event id a seen row holds (``SeenEvent.event_id``)
SEEN_ID_LENGTH = SeenEvent._meta.get_field("event_id").max_length or 255
#: seconds between two prunes of the seen ids by one puller
PRUNE_EVERY_SECONDS = 3600.0
#: most seen ids one prune statement deletes (a prune is a loop of such deletes)
PRUNE_BATCH = 1000
#: a failing pull is tried again after at most this many seconds (doubling from 0.1)
PULL_BACKOFF_MAX = 10.0
#: seconds between two log lines while pulls keep failing (the first failure is logged at once)
FAILING_LOG_EVERY = 60.0


#: gRPC channel options of a subscriber on the emulator: no limit on a received message (gRPC's
#: default is 4 MiB; Pub/Sub's messages reach 10 MB), as Google's client sets for Pub/Sub itself
EMULATOR_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
)


def subscriber_client() -> SubscriberClient:
    """A ``SubscriberClient``; on the emulator (``PUBSUB_EMULATOR_HOST``) over a channel without
    gRPC's 4 MiB limit on a received message (Google's client opens the emulator's channel
    without the options it gives its channel to Pub/Sub: one message over 4 MiB failed every
    pull of its subscription)."""
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    if not host:
        return SubscriberClient()
    channel = grpc.insecure_channel(host, options=EMULATOR_CHANNEL_OPTIONS)
    return SubscriberClient(transport=SubscriberGrpcTransport(channel=channel, host=host))


class InboxPuller:
    """Pulls one subscription into one inbox queue on a thread of its own (see the module
    docstring); ``start()``, then ``stop()`` returns once the thread has ended (an in-flight
    pull ends within ``PULL_WAIT_SECONDS``)."""

    def __init__(self, model: type[Queue], params: PubSubParams | None = None) -> None:
        self.model = model
        self.params = params or pubsub_params()
        self.subscription = resource_path(
            "subscriptions", str(queue_options(model).pubsub_subscription), self.params
        )
        engine = self.engine = engine_for(model)
        self.database = engine.database
        self.retries = engine.params.transaction_retries
        #: the key fields: the Pub/Sub ordering key's (an ordered inbox's; else None) and the
        #: event id's
        self.ordering_field, self.key_field = inbox_key(model)
        #: the longest event id taken in: what both the key and ``SeenEvent.event_id`` hold
        self.max_id_length = min(self.key_field.max_length or SEEN_ID_LENGTH, SEEN_ID_LENGTH)
        #: the longest ordering key an ordered inbox takes in (its field's length)
        self.max_ordering_length = (
            getattr(self.ordering_field, "max_length", None) or MAX_ORDERING_KEY_BYTES
        )
        self.label = model._meta.label
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_prune = 0.0
        #: counters since start (read by tests and benchmarks)
        self.taken_in = 0
        self.duplicates = 0
        self.pulls = 0
        self.pull_failures = 0
        self._state_lock = threading.Lock()
        #: the failure episode under way (None while pulls succeed)
        self._episode: _Episode | None = None
        #: why the thread ended, when it ended other than by ``stop()``
        self._ended: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run, name=f"sq-pubsub-inbox-{self.label}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self.params.pull_wait + 30)

    def run(self) -> None:
        """Pull until stopped. Every failure (the client that cannot be made, without
        credentials; a pull Pub/Sub refuses, the subscription deleted; the database) is tried
        again after a back-off, and is an episode until a pull succeeds: ``problems()`` says
        why (``/readyz`` then answers 503), it is logged once as it starts, every
        ``FAILING_LOG_EVERY`` seconds while it lasts and once when it ends."""
        subscriber: Any = None
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    if subscriber is None:
                        subscriber = subscriber_client()
                    got = self.pull_once(subscriber)
                except Exception as exc:
                    failures += 1
                    self._failed(exc)
                    wait = min(0.1 * 2**failures, PULL_BACKOFF_MAX) * random.uniform(0.75, 1)
                    self._stop.wait(wait)
                    continue
                failures = 0
                self._pulled()
                if not got:
                    self._stop.wait(0.05)
                self.prune_if_due()
        except BaseException as exc:  # the thread ends: problems() says so
            self._ended = f"{type(exc).__name__}: {exc}"
            logger.exception("inbox %s: the puller has ended", self.label)
            raise
        finally:
            if subscriber is not None:
                subscriber.close()
            connections.close_all()  # this thread's connections

    def problems(self) -> list[str]:
        """Why this inbox does not take its events in now (empty while its pulls succeed): a
        readiness check ``runqueueworker`` adds to ``/readyz``."""
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self._stop.is_set():
            return [f"inbox {self.label}: its puller has ended ({self._ended or 'unknown'})"]
        with self._state_lock:
            episode = self._episode
        if episode is None:
            return []
        return [
            f"inbox {self.label}: cannot pull {self.subscription} for "
            f"{time.monotonic() - episode.since:.0f} s ({episode.failures} failed pull(s), "
            f"retrying with back-off): {episode.error}"
        ]

    def _failed(self, exc: Exception) -> None:
        """A failed pull: counted, signalled, and logged as its episode goes (see ``run``)."""
        error = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        with self._state_lock:
            self.pull_failures += 1
            episode = self._episode
            if episode is None:
                episode = self._episode = _Episode(since=now, error=error)
            episode.failures += 1
            episode.error = error
            remind = episode.failures == 1 or now - episode.logged_at >= FAILING_LOG_EVERY
            if remind:
                episode.logged_at = now
        inbox_pull_failed.send_robust(self.model, error=exc)
        if episode.failures == 1:
            logger.warning(
                "inbox %s: pulling %s failed (%s); retrying with back-off, /readyz says so "
                "until a pull succeeds",
                self.label,
                self.subscription,
                error,
                exc_info=exc,
                extra={"action": "pull_failed", "queue": self.label},
            )
        elif remind:
            logger.warning(
                "inbox %s: still cannot pull %s: %d failed pull(s) in %.0f s (%s)",
                self.label,
                self.subscription,
                episode.failures,
                now - episode.since,
                error,
                extra={"action": "pull_failing", "queue": self.label},
            )

    def _pulled(self) -> None:
        """A pull succeeded: the failure episode, if any, ends."""
        with self._state_lock:
            episode, self._episode = self._episode, None
        if episode is not None:
            logger.warning(
                "inbox %s: pulling again after %d failed pull(s) in %.0f s",
                self.label,
                episode.failures,
                time.monotonic() - episode.since,
                extra={"action": "pull_recovered", "queue": self.label},
            )

    def pull_once(self, subscriber: Any) -> int:
        """One pull, taken in and acked; returns how many Pub/Sub messages came."""
        try:
            response = subscriber.pull(
                subscription=self.subscription,
                max_messages=self.params.pull_max_messages,
                timeout=self.params.pull_wait,
                retry=None,
            )
        except google_exceptions.DeadlineExceeded:
            response = None  # nothing came within the wait
        received = list(response.received_messages) if response is not None else []
        with self._state_lock:
            self.pulls += 1
        inbox_pulled.send_robust(self.model, count=len(received))
        if not received:
            return 0
        ack_ids = self.take_in(received)
        if ack_ids:
            subscriber.acknowledge(subscription=self.subscription, ack_ids=ack_ids)
        return len(received)

    def take_in(self, received: Sequence[Any]) -> list[str]:
        """Write the new events of ``received`` (Pub/Sub ``ReceivedMessage``s) into the inbox
        in one transaction; return the ack ids of those taken in or dropped as duplicates."""
        events, accepted, replays = self._accept(received)
        refused: set[str] = set()  # the queue cannot hold them: not acked
        queued: set[str] = set()  # still queued under that key: duplicates
        for _ in range(len(events) + 3):
            try:
                sent = run_in_transaction(
                    lambda: self._write(events, replays, refused, queued),
                    using=self.database,
                    retries=self.retries,
                )
                break
            except _Again:
                continue  # rolled back: again, without the refused or queued event
            except IntegrityError:
                continue  # another puller took one of them in meanwhile: read again
        else:
            raise RuntimeError(f"inbox {self.label}: could not take in a pull")
        ack_ids = [ack_id for ack_id, eid in accepted if eid not in refused]
        self._count(sent, dropped=len(ack_ids) - sent)
        return ack_ids

    def _accept(
        self, received: Sequence[Any]
    ) -> tuple[dict[str, _Event], list[tuple[str, str]], dict[str, set[str]]]:
        """The events of ``received`` by event id, in the order received (the first data and
        ordering key of each), the (ack id, event id) of every message the inbox can hold (its
        event id, its data, an ordered inbox's ordering key: validated here, before the pull's
        transaction, so a refused event never makes it run again), and the copies of each
        event: the ids of the accepted replays (``AcceptedReplay``) that replayed it, "" for an
        ordinary copy (a replay this inbox does not accept included). The messages the inbox
        cannot hold are logged and left unacked; in an ordered inbox so are the later messages
        of their ordering key (but "", no key): taken in, they would run before it."""
        events: dict[str, _Event] = {}
        accepted: list[tuple[str, str]] = []  # (ack id, event id)
        copies: dict[str, set[str]] = {}
        refused: set[str] = set()
        held: set[str] = set()  # ordering keys with a refused message in this pull
        takes = self._accepted_replays(received)
        for r in received:
            message = r.message
            ordering = self._ordering_key_of(message)
            if ordering in held:
                continue
            eid = message.attributes.get(EVENT_ID_ATTRIBUTE) or message.message_id
            if not eid or len(eid) > self.max_id_length:
                logger.error(
                    "inbox %s: Pub/Sub message %s has an event id of %d characters (the key "
                    "and the seen ids hold %d); not acked",
                    self.label,
                    message.message_id,
                    len(eid or ""),
                    self.max_id_length,
                    extra={"action": "pull_refused", "queue": self.label},
                )
                eid = ""
            elif eid not in events and eid not in refused:
                event = (bytes(message.data), ordering)
                if self._holds(eid, event):
                    events[eid] = event
                else:
                    refused.add(eid)
            if not eid or eid in refused:
                if ordering:
                    held.add(ordering)
                continue
            accepted.append((r.ack_id, eid))
            replay = message.attributes.get(REPLAY_ID_ATTRIBUTE, "")
            copies.setdefault(eid, set()).add(replay if replay in takes else "")
        return events, accepted, copies

    def _accepted_replays(self, received: Sequence[Any]) -> set[str]:
        """The replay ids of ``received`` this inbox accepts (one read, only when a message
        carries a replay id)."""
        replays = {r.message.attributes.get(REPLAY_ID_ATTRIBUTE, "") for r in received} - {""}
        if not replays:
            return set()
        ids = [accepted_replay_id(self.label, r) for r in replays]
        return set(
            AcceptedReplay.objects.using(self.database)
            .filter(id__in=ids)
            .values_list("replay_id", flat=True)
        )

    def _ordering_key_of(self, message: Any) -> str:
        """What an ordered inbox keys ``message`` by: its Pub/Sub ordering key, "" when it has
        none (such messages share one key of the inbox: one at a time); "" in an unordered
        inbox (not stored)."""
        return str(message.ordering_key or "") if self.ordering_field is not None else ""

    def _spec(self, eid: str, event: _Event) -> dict[str, Any]:
        """The message of event ``eid`` as the inbox queue takes it: its key and payload."""
        data, ordering = event
        spec: dict[str, Any] = {self.key_field.name: eid, "payload": data}
        if self.ordering_field is not None:
            spec[self.ordering_field.name] = ordering
        return spec

    def _holds(self, eid: str, event: _Event) -> bool:
        """Whether the queue can hold event ``eid`` with its data and ordering key
        (``api.build_message``: what a send checks before it writes anything); logged when it
        cannot."""
        ordering = event[1]
        if len(ordering) > self.max_ordering_length:
            logger.error(
                "inbox %s: event %s has an ordering key of %d characters (the key field holds "
                "%d); not acked",
                self.label,
                eid,
                len(ordering),
                self.max_ordering_length,
                extra={"action": "pull_refused", "queue": self.label},
            )
            return False
        try:
            api.build_message(self.model, self._spec(eid, event), engine=self.engine)
        except PayloadError as exc:
            logger.error(
                "inbox %s: event %s cannot be held by the queue (%s); not acked",
                self.label,
                eid,
                exc,
                extra={"action": "pull_refused", "queue": self.label},
            )
            return False
        return True

    def _write(
        self,
        events: dict[str, _Event],
        copies: dict[str, set[str]],
        refused: set[str],
        queued: set[str],
    ) -> int:
        """The transaction of a pull: send each event not yet seen (nor ``refused`` or
        ``queued``) to the queue and record its ``SeenEvent``s, both or neither; returns how
        many were sent, in the order received (an ordered inbox's keys keep Pub/Sub's order).
        A copy is seen when its seen row exists: an ordinary copy's
        ``seen_id(inbox, event id)``, an accepted replay's ``seen_id(inbox, event id, replay
        id)``; taking an event in records both. An event the queue refuses or still holds is
        added to ``refused`` or ``queued`` and ``_Again`` rolls the whole transaction back."""
        label = self.label
        decide = {e: {seen_id(label, e, r) for r in copies.get(e, {""})} for e in events}
        record = {e: ids | {seen_id(label, e)} for e, ids in decide.items()}
        every = [i for ids in record.values() for i in ids]
        seen = set(
            SeenEvent.objects.using(self.database).filter(id__in=every).values_list("id", flat=True)
        )
        new = [e for e in events if not decide[e] <= seen and e not in refused and e not in queued]
        for eid in new:
            self._send(eid, events[eid], refused, queued)
        now = clock.now()
        SeenEvent.objects.using(self.database).bulk_create(
            [
                SeenEvent(id=i, inbox=label, event_id=e, seen_at=now)
                for e in new
                for i in sorted(record[e] - seen)
            ]
        )
        return len(new)

    def _send(self, eid: str, event: _Event, refused: set[str], queued: set[str]) -> None:
        """Send one event to the queue under its event id; raises ``_Again`` after adding it to
        ``queued`` (still queued: its seen row pruned early, which is rare) or ``refused`` (the
        queue cannot hold it: logged, not acked; ``_accept`` refuses such events before the
        transaction)."""
        try:
            api.send(self.model, using=self.database, **self._spec(eid, event))
        except MessageAlreadyExists as exc:  # its seen row pruned early
            queued.add(eid)
            raise _Again() from exc
        except PayloadError as exc:
            logger.error(
                "inbox %s: event %s cannot be held by the queue (%s); not acked",
                self.label,
                eid,
                exc,
                extra={"action": "pull_refused", "queue": self.label},
            )
            refused.add(eid)
            raise _Again() from exc

    def _count(self, sent: int, *, dropped: int) -> None:
        """Add a pull's events to the counters; signal the duplicates dropped, if any."""
        self.taken_in += sent
        if dropped:
            self.duplicates += dropped
            inbox_duplicates_dropped.send_robust(self.model, count=dropped)

    def prune_if_due(self) -> None:
        """Delete seen ids older than the window, at most every ``PRUNE_EVERY_SECONDS``."""
        if time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + PRUNE_EVERY_SECONDS
        try:
            prune(self.label, self.params.dedup_window_days, using=self.database)
        except Exception:
            logger.exception("inbox %s: pruning seen event ids failed", self.label)


@dataclass(slots=True)
class _Episode:
    """Pulls failing in a row: since when (monotonic), how many, the last error."""

    since: float
    error: str
    failures: int = 0
    logged_at: float = 0.0


#: a pulled event: its data and (an ordered inbox's) ordering key
_Event = tuple[bytes, str]


class _Again(Exception):
    """A pull's transaction is rolled back to be run again without a refused event."""


def prune(inbox: str, days: int, *, using: str) -> int:
    """Delete the seen ids of ``inbox`` older than ``days``, ``PRUNE_BATCH`` at a time;
    returns how many went."""
    cutoff = clock.now() - timedelta(days=days)
    total = 0
    while True:
        ids = list(
            SeenEvent.objects.using(using)
            .filter(inbox=inbox, seen_at__lt=cutoff)
            .values_list("id", flat=True)[:PRUNE_BATCH]
        )
        if not ids:
            return total
        total += SeenEvent.objects.using(using).filter(id__in=ids).delete()[0]
