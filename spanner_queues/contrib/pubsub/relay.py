"""The relay: a batch receiver of each relayed queue (``QueueMeta.pubsub_topic``), registered by
the app's ``ready()``, run by ``runqueueworker`` like any receiver (leases renewed, SIGTERM
drains, ``--burst``, health and metrics).

One run publishes a batch with Google's client (its batching), waits for every confirmation,
hands the confirmed messages over to be acked and returns; under a worker they are acked in a
thread of the relay's (``_Acks``) while the queue's next run builds and publishes, and the
worker's ``run()`` returns only once they are (``worker_stopped``). So a message leaves its
queue only after Pub/Sub confirmed it; an ack that fails (a lease lost meanwhile, the database)
is logged, and the message comes back when its lease ends and is published again under the
same event id (at least once, as after a kill between publish and ack).

A message Pub/Sub refuses for good is moved to the queue's dead-letter queue: one the client
refuses before sending it (too large, bad attributes), or one Pub/Sub refuses
(``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``; it refuses a whole request for one message) when
published again alone while another message of the run got through. A refusal of everything the
run published, ``ALONE_PROBES`` messages published alone included, is the topic's (a malformed
or schema-validated topic, a disabled key), not the messages': like an unreachable Pub/Sub, a
missing topic or a timeout, it is the queue's failure. Then the confirmed messages are acked and
the run raises ``PublishFailed``, a ``Retry``: the rest are sent again under their keys, due
after the queue's back-off, without spending an attempt; until that back-off has passed, runs of
the queue publish nothing and send their messages again for that time (a circuit breaker per
queue and process). Such a failure episode is logged once with its traceback, then one line a
minute with its counts, and once when it ends.

A run publishes with ``Publisher`` (``spanner_queues.contrib.pubsub.publish``): each ordering
key's messages of the run in one request, in their order, all requests at once, on the channel of
Google's client; nothing is kept between runs (no key is left paused by a failure).

A run waits for Pub/Sub no longer than ``PUBLISH_TIMEOUT_SECONDS`` nor past the receiver's time
limit (``--timeout``, less ``TIME_LIMIT_MARGIN``): what is not confirmed by then is given back
as above, and the worker's time limit never has to interrupt a run.

While ``ARCHIVE_DAYS`` is on, the confirmed messages are acked in one transaction with a
``RelayedEvent`` row for each (the archive ``pubsubreplay`` publishes from), so an event is
archived if and only if its ack committed. Outside a worker (the test kit's ``drain``) a run
acks them itself before it returns. Rows past the
window are pruned (``prune_archive``, at most every ``ARCHIVE_PRUNE_EVERY_SECONDS`` per process
and database).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections

from spanner_queues import api, clock
from spanner_queues.contrib.pubsub.conf import (
    MAX_ORDERING_KEY_BYTES,
    PubSubUnavailable,
    ordering_fields,
    pubsub_params,
    resource_path,
)
from spanner_queues.contrib.pubsub.models import RelayedEvent
from spanner_queues.deadletter import dead_letter
from spanner_queues.drivers import driver_of
from spanner_queues.engines import engine_for
from spanner_queues.envelope import CLOUDEVENTS, envelope_of
from spanner_queues.exceptions import Retry
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.receivers import (
    MessageContext,
    ReceiverRegistry,
    ReceiverSpec,
    held_lease_token,
    mark_acked,
)
from spanner_queues.signals import messages_published, publish_failed, worker_stopped
from spanner_queues.transactions import run_in_transaction

try:
    from google.api_core import exceptions as google_exceptions
    from google.cloud.pubsub_v1 import PublisherClient
    from google.cloud.pubsub_v1.publisher import exceptions as publisher_exceptions

    from spanner_queues.contrib.pubsub.publish import UNSENT, Outgoing, Publisher
except ImportError:
    raise PubSubUnavailable(
        "spanner_queues.contrib.pubsub needs google-cloud-pubsub: "
        "pip install 'spanner-queues[pubsub]'."
    ) from None

if TYPE_CHECKING:
    from django.db import models

    from spanner_queues.models import Queue

logger = logging.getLogger("spanner_queues.pubsub")

#: the attributes of every relayed Pub/Sub message
EVENT_ID_ATTRIBUTE = "event_id"
QUEUE_ATTRIBUTE = "queue"
KEY_ATTRIBUTE = "key"
#: the attribute of a replayed message (``pubsubreplay``): the replay's id
REPLAY_ID_ATTRIBUTE = "replay_id"
#: Pub/Sub's limit on an attribute value (https://cloud.google.com/pubsub/quotas)
MAX_ATTRIBUTE_BYTES = 1024

#: errors that mean Pub/Sub will never take this message: dead-lettered, not retried (one
#: Pub/Sub answers is the message's only when Pub/Sub took another of the run: see the docstring)
REFUSED = (
    google_exceptions.InvalidArgument,
    google_exceptions.FailedPrecondition,
    publisher_exceptions.MessageTooLargeError,
    TypeError,
    ValueError,
)
#: a failing queue's back-off: from this many seconds, doubling, to ``BACKOFF_MAX`` (jittered)
BACKOFF_MIN = 1.0
BACKOFF_MAX = 60.0
#: seconds between two log lines of a failure episode (its first failure is logged at once)
FAILING_LOG_EVERY = 60.0
#: seconds a run keeps before its time limit (to give back what is not confirmed)
TIME_LIMIT_MARGIN = 1.0
#: messages Pub/Sub refused, published alone in turn and refused again while none of the run
#: got through, after which the refusal is taken for the topic's (``_sort_suspects``)
ALONE_PROBES = 8


class PublishFailed(Retry):
    """Pub/Sub did not confirm some messages of a relay run (unreachable, a missing topic or
    permission, a refusal of the whole publish, a timeout): a ``Retry``, so they are sent again
    under their keys, due after the queue's back-off, without spending an attempt."""


def event_id(message: Message) -> str:
    """The event id of a sent message: the same on every publish of it, and new for every send.
    A relayed queue stores each message as an event (``spanner_queues.envelope``): its ``id``,
    a UUID made in the send. A message stored raw (sent before its queue was relayed, or
    before this release) has none: a digest of the queue, the key and the stored payload,
    which no receive, renewal or release changes (two such sends alike are one event)."""
    event = message.event
    if event is not None and event.get("id"):
        return str(event["id"])
    digest = hashlib.sha256()
    digest.update(message.queue.encode())
    digest.update(b"\0")
    digest.update(key_text(message).encode())
    digest.update(b"\0")
    digest.update(message.stored_payload)
    return digest.hexdigest()[:32]


def published_data(message: Message) -> bytes:
    """What the relay publishes of a message: on a ``cloudevents`` envelope queue the whole
    stored event (its ``traceparent`` included); elsewhere the payload (a relayed queue's
    event's data, as a raw queue would store it)."""
    if envelope_of(message.queue) == CLOUDEVENTS:
        return message.stored_payload
    return message.payload


#: one encoder for every ``key_text`` (``json.dumps`` with arguments builds one a call)
_KEY_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))


def key_text(message: Message) -> str:
    """The message key as the ``key`` attribute: a JSON array of its values."""
    return _KEY_ENCODER.encode(list(message.key))


def ordering_key(model: type[models.Model], message: Message) -> str:
    """The message's ordering key ("" for none): its ordering fields' values joined by "/"."""
    return _ordering_key(ordering_fields(model), message)


def _ordering_key(fields: tuple[str, ...], message: Message) -> str:
    if not fields:
        return ""
    values = message.key_dict
    text = "/".join(str(values.get(name, values.get(f"{name}_id"))) for name in fields)
    return text if len(text.encode()) <= MAX_ORDERING_KEY_BYTES else ""


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def publisher() -> Publisher:
    """This process's publisher (one, thread-safe), on the channel of one ``PublisherClient``
    (its credentials and endpoint; ``PUBSUB_EMULATOR_HOST`` is the client's)."""
    global _publisher
    with _publisher_lock:
        if _publisher is None:
            _publisher = Publisher(PublisherClient())
        return _publisher


def relay(context: MessageContext, messages: list[Message]) -> None:
    """Publish ``messages`` of a relayed queue and wait for Pub/Sub's confirmations (see the
    module docstring for what follows a refusal or a failure)."""
    model = context.queue
    params = pubsub_params()
    topic = resource_path("topics", str(queue_options(model).pubsub_topic), params)
    episode = _episode(model)
    if episode is not None:
        episode.hold(model, messages)  # raises PublishFailed while the back-off lasts
    deadline = _deadline(context, params.publish_timeout)
    client = publisher()
    sent: _Sent = {}
    outgoing = _outgoing(topic, model, messages, sent)
    outcomes = client.publish([out for out in outgoing if isinstance(out, Outgoing)], deadline)
    confirmed, refused, suspect, failed = _sort_outcomes(messages, outgoing, iter(outcomes))
    if suspect:
        _sort_suspects(client, deadline, model, suspect, outgoing, confirmed, refused, failed)
    _report_confirmed(model, topic, confirmed)
    for m, error in refused:
        _dead_letter_refused(model, topic, m, error)
    if not failed:
        _recovered(model)
        # under a worker: acked beside its next run (unless the queue's acks are stuck)
        handed = context.worker_id is not None and _acks.hand_over(
            model, confirmed, params.archive_days, sent, _deadline(context, ACKS_WAIT_SECONDS)
        )
        if not handed and params.archive_days:  # acked here with their archive rows
            _ack_confirmed(model, confirmed, params.archive_days, sent)
            _prune_archive_if_due(model, params.archive_days)
        return  # (the dead-lettered are acked)
    _give_back(model, topic, messages, confirmed, failed, params.archive_days, sent)


def _deadline(context: MessageContext, seconds: float) -> float:
    """``time.monotonic()`` past which the run waits no more (for Pub/Sub, for its queue's
    place among the outstanding acks): ``seconds`` from now, or sooner, ``TIME_LIMIT_MARGIN``
    before the receiver's time limit."""
    deadline = time.monotonic() + seconds
    if context.deadline is not None:
        deadline = min(deadline, context.deadline - TIME_LIMIT_MARGIN)
    return deadline


# --- a failing queue's episode (per queue, in this process) ------------------------------------
@dataclass(slots=True)
class _Episode:
    """Runs of one queue failing in a row: since when, how many, the messages given back, the
    back-off, the last log line (monotonic seconds)."""

    since: float
    runs: int = 0
    given_back: int = 0
    retry_at: float = 0.0
    logged_at: float = 0.0

    def hold(self, model: type[Queue], messages: list[Message]) -> None:
        """While the back-off lasts, give ``messages`` back for what is left of it without
        publishing (``PublishFailed``); after it, let the run try (the circuit's probe)."""
        left = self.retry_at - time.monotonic()
        if left <= 0:
            return
        with _episodes_lock:
            self.given_back += len(messages)
        raise PublishFailed(
            timedelta(seconds=left),
            reason=f"Pub/Sub failing for {model._meta.label}: trying again in {left:.1f} s",
        )


_episodes: dict[str, _Episode] = {}
_episodes_lock = threading.Lock()


def _episode(model: type[Queue]) -> _Episode | None:
    with _episodes_lock:
        return _episodes.get(model._meta.label)


def _failing(model: type[Queue], topic: str, given_back: int, error: BaseException) -> float:
    """A failed run of ``model``: counted in its episode (begun if none), logged once with its
    traceback as the episode begins, then a line every ``FAILING_LOG_EVERY`` seconds; returns
    the back-off (seconds) after which its messages are due again."""
    now = time.monotonic()
    label = model._meta.label
    with _episodes_lock:
        episode = _episodes.get(label)
        first = episode is None
        if episode is None:
            episode = _episodes[label] = _Episode(since=now, logged_at=now)
        episode.runs += 1
        episode.given_back += given_back
        backoff = min(BACKOFF_MIN * 2 ** (episode.runs - 1), BACKOFF_MAX)
        backoff *= random.uniform(0.75, 1)
        episode.retry_at = now + backoff
        remind = not first and now - episode.logged_at >= FAILING_LOG_EVERY
        if remind:
            episode.logged_at = now
        runs, given, since = episode.runs, episode.given_back, episode.since
    if first:
        logger.warning(
            "%s: publishing to %s failed (%s: %s); its messages are sent again after a "
            "back-off (from %g s to %g s), without spending attempts, until a publish works",
            label,
            topic,
            type(error).__name__,
            error,
            BACKOFF_MIN,
            BACKOFF_MAX,
            exc_info=error,
            extra={"action": "publish_failing", "queue": label},
        )
    elif remind:
        logger.warning(
            "%s: publishing to %s still fails: %d failed run(s), %d message(s) given back in "
            "%.0f s (%s: %s)",
            label,
            topic,
            runs,
            given,
            now - since,
            type(error).__name__,
            error,
            extra={"action": "publish_failing", "queue": label},
        )
    return backoff


def _recovered(model: type[Queue]) -> None:
    """A run published everything: the queue's failure episode, if any, ends (logged once)."""
    label = model._meta.label
    with _episodes_lock:
        episode = _episodes.pop(label, None)
    if episode is not None:
        logger.warning(
            "%s: publishing again after %d failed run(s), %d message(s) given back in %.0f s",
            label,
            episode.runs,
            episode.given_back,
            time.monotonic() - episode.since,
            extra={"action": "publish_recovered", "queue": label},
        )


#: what a run published of each message (by ``id``): its attributes and data, worked out once
#: for the publish and the archive (each is a JSON encoding or an event's parse)
_Sent = dict[int, tuple[dict[str, str], bytes]]


def _outgoing(
    topic: str, model: type[Queue], messages: list[Message], sent: _Sent
) -> list[Outgoing | BaseException]:
    """What each message publishes (in ``messages``' order; what was published is also kept in
    ``sent``), or why it cannot be published: ``ValueError`` for an attribute over Pub/Sub's
    limit (which its emulator would take: checked here), or the error that building it
    raised (a stored value it cannot encode). Either is refused: dead-lettered, the others
    published."""
    fields = ordering_fields(model)
    outgoing: list[Outgoing | BaseException] = []
    for m in messages:
        try:
            attributes = {
                EVENT_ID_ATTRIBUTE: event_id(m),
                QUEUE_ATTRIBUTE: m.queue,
                KEY_ATTRIBUTE: key_text(m),
            }
            data = published_data(m)
        except Exception as exc:  # a stored message it cannot publish (a bad value)
            outgoing.append(exc)
            continue
        sent[id(m)] = (attributes, data)
        too_long = [  # (a character is at most 4 bytes: a short one is not encoded to tell)
            a
            for a, v in attributes.items()
            if len(v) * 4 > MAX_ATTRIBUTE_BYTES and len(v.encode()) > MAX_ATTRIBUTE_BYTES
        ]
        if too_long:
            outgoing.append(
                ValueError(
                    f"attribute {too_long[0]!r} is over Pub/Sub's {MAX_ATTRIBUTE_BYTES} bytes"
                )
            )
        else:
            outgoing.append(Outgoing(topic, data, _ordering_key(fields, m), attributes))
    return outgoing


_Refused = list[tuple[Message, BaseException]]
_Failed = list[tuple[Message, int, BaseException]]


def _sort_outcomes(
    messages: list[Message], outgoing: list[Outgoing | BaseException], outcomes: Any
) -> tuple[list[Message], _Refused, _Failed, _Failed]:
    """Sort the messages by what became of them: confirmed by Pub/Sub; refused before they were
    sent (the client's checks or ours: dead-lettered); refused by Pub/Sub (``REFUSED``:
    suspects, the message's fault or the topic's); or failed (given back; not confirmed by the
    deadline too), the last two with their place in ``messages``. ``outcomes`` yields one
    outcome for each ``Outgoing`` of ``outgoing``, in order."""
    confirmed: list[Message] = []
    refused: _Refused = []
    suspect: _Failed = []
    failed: _Failed = []
    for i, (m, out) in enumerate(zip(messages, outgoing, strict=True)):
        error = out if isinstance(out, BaseException) else next(outcomes)
        if error is None:
            confirmed.append(m)
        elif isinstance(out, BaseException) or isinstance(error, UNSENT):
            refused.append((m, error))  # never left this process
        elif isinstance(error, REFUSED):
            suspect.append((m, i, error))
        else:
            failed.append((m, i, error))
    return confirmed, refused, suspect, failed


def _sort_suspects(
    client: Publisher,
    deadline: float,
    model: type[Queue],
    suspect: _Failed,
    outgoing: list[Outgoing | BaseException],
    confirmed: list[Message],
    refused: _Refused,
    failed: _Failed,
) -> None:
    """Pub/Sub refused the publishes of ``suspect``: it refuses a whole request for one bad
    message, or for the topic (malformed, schema-validated, a disabled key). Each is published
    again alone, in turn, into ``confirmed``, ``refused`` or ``failed``. A message refused alone
    is the message's fault (``refused``: dead-lettered) once another message of the run got
    through; while none did, it is undecided, and after ``ALONE_PROBES`` undecided in a row
    (or at the end with none through) the topic's fault: every undecided or untried suspect is
    ``failed`` (the queue's failure, given back), none dead-lettered. A suspect after a failed
    one of its ordering key is given back untried (its order kept)."""
    undecided: _Failed = []
    held: set[str] = set()  # ordering keys with a suspect given back: their later ones too
    for n, (m, i, first_error) in enumerate(suspect):
        out = outgoing[i]
        assert isinstance(out, Outgoing)
        if out.ordering_key and out.ordering_key in held:
            failed.append((m, i, first_error))
            continue
        if deadline - time.monotonic() <= 0:  # no time left to tell: given back
            failed.extend(undecided + suspect[n:])
            return
        [error] = client.publish([out], deadline)
        if error is None:
            confirmed.append(m)
        elif not isinstance(error, REFUSED):
            failed.append((m, i, error))
            if out.ordering_key:
                held.add(out.ordering_key)
        elif confirmed:
            refused.append((m, error))
        else:
            undecided.append((m, i, error))
            if len(undecided) >= ALONE_PROBES:  # the topic's refusal, not the messages'
                failed.extend(undecided + suspect[n + 1 :])
                return
    if confirmed:
        refused.extend((m, exc) for m, _i, exc in undecided)
    else:
        failed.extend(undecided)


def _report_confirmed(model: type[Queue], topic: str, confirmed: list[Message]) -> None:
    """Send ``messages_published`` for the confirmed messages, with each one's lag since it was
    sent (nothing when none was confirmed)."""
    if not confirmed:
        return
    now = clock.now()
    lags = [
        max((now - (m.send_time or m.deliver_time or now)).total_seconds(), 0.0) for m in confirmed
    ]
    messages_published.send_robust(model, messages=confirmed, topic=topic, lags=lags)


def _dead_letter_refused(model: type[Queue], topic: str, m: Message, error: BaseException) -> None:
    """Log a message Pub/Sub refused for good, ack it and send it to the dead-letter queue in
    one transaction, then send ``publish_failed`` with ``refused=True``."""
    logger.error(
        "%s: Pub/Sub refused it (%s: %s); moved to the dead-letter queue",
        m,
        type(error).__name__,
        error,
        extra={"action": "publish_refused", "queue": m.queue},
    )
    dead_letter(m)  # ack + send to the dead-letter queue, one transaction
    publish_failed.send_robust(model, messages=[m], topic=topic, error=error, refused=True)


def _give_back(
    model: type[Queue],
    topic: str,
    messages: list[Message],
    confirmed: list[Message],
    failed: _Failed,
    archive_days: int,
    sent: _Sent,
) -> None:
    """After a failed publish: ack the confirmed messages (they are in Pub/Sub; only the failed
    ones come back; archived when ``archive_days``), send ``publish_failed``, count the failure
    in the queue's episode and raise ``PublishFailed`` from the first error, due after the
    episode's back-off. Always raises."""
    _ack_confirmed(model, confirmed, archive_days, sent)  # in Pub/Sub: only they come back
    first = failed[0][2]
    publish_failed.send_robust(
        model, messages=[m for m, _, _ in failed], topic=topic, error=first, refused=False
    )
    backoff = _failing(model, topic, len(failed), first)
    raise PublishFailed(
        timedelta(seconds=backoff),
        reason=f"{len(failed)} of {len(messages)} message(s) of {model._meta.label} not "
        f"confirmed by Pub/Sub ({topic}): {type(first).__name__}: {first}",
    ) from first


def _ack_confirmed(
    model: type[Queue], confirmed: list[Message], archive_days: int, sent: _Sent
) -> None:
    """Ack the ``confirmed`` messages in one transaction and, when ``archive_days`` (the
    archive is on), write each one's ``RelayedEvent`` in it: an event is archived if and only
    if its ack committed."""
    if not confirmed:
        return
    database = engine_for(model).database
    rows = _archive_rows(model, confirmed, database, sent) if archive_days else []
    _ack_with_archive(model, confirmed, rows)


def _ack_with_archive(model: type[Queue], messages: list[Message], rows: list[tuple]) -> None:
    """Ack ``messages`` and insert their archive ``rows`` (``_archive_rows``; none when the
    archive is off) in one transaction: all or none."""
    engine = engine_for(model)
    database = engine.database

    def ack() -> None:
        if rows:
            _archive(rows, database)
        api.ack_many(model, messages)

    run_in_transaction(ack, using=database, retries=engine.params.transaction_retries)


# --- the acks of a worker's relay runs, beside its next run -----------------------------------
#: acks of one queue handed over and not committed yet after which a run waits to hand over
#: its own (the queue's next runs publish while the last ones' acks commit; with one, a run
#: often waited for an ack that waited for the write lock behind a claim, on SQLite)
ACKS_AHEAD = 2
#: seconds the ack thread waits for work before it ends (closing its connections)
ACKER_IDLE_SECONDS = 10.0
#: seconds ``flush_acks`` waits at most (a worker stopping) for the acks handed over: about a
#: lease, after which what is left comes back anyway
ACKS_FLUSH_SECONDS = 10.0
#: seconds a run waits at most for its queue's place among the outstanding acks (or until
#: its time limit, less ``TIME_LIMIT_MARGIN``: ``_deadline``); past it the run acks its
#: messages itself
ACKS_WAIT_SECONDS = 10.0


@dataclass(slots=True)
class _AckJob:
    """The confirmed messages of one run, the lease token of each when it was handed over (its
    lease frozen: no longer renewed) and what the run published of them (for their archive
    rows, when ``archive_days``), to ack in one transaction. The rows and the messages as
    acked are built here, in the ack thread, not in the run."""

    model: type[Queue]
    messages: list[Message]
    tokens: list[str | None]
    sent: _Sent
    archive_days: int

    def run(self) -> None:
        database = engine_for(self.model).database
        try:
            frozen = [
                m.with_lease(token, m.lease_expires_at)
                for m, token in zip(self.messages, self.tokens, strict=True)
            ]
            rows = (
                _archive_rows(self.model, self.messages, database, self.sent)
                if self.archive_days
                else []
            )
            _ack_with_archive(self.model, frozen, rows)
        except Exception as exc:
            logger.warning(
                "%s: the acks of %d message(s) Pub/Sub confirmed failed (%s: %s); they are "
                "published again when their leases end, under the same event ids",
                self.model._meta.label,
                len(self.messages),
                type(exc).__name__,
                exc,
                exc_info=exc,
                extra={"action": "relay_ack_failed", "queue": self.model._meta.label},
            )
            connections[database].close_if_unusable_or_obsolete()
            return
        if self.archive_days:
            _prune_archive_if_due(self.model, self.archive_days)


class _Acks:
    """The acks of the relay runs of a worker (``runqueueworker``), in one thread of this
    process: a run hands its confirmed messages over and returns, and its queue's next run
    builds and publishes while they commit (the database's work beside Pub/Sub's, instead of
    after it). Each queue has at most ``ACKS_AHEAD`` acks handed over and not committed: a run
    waits to hand over more (``ACKS_WAIT_SECONDS`` at most, or to its time limit; then it acks
    its own, archive rows included: ``relay_ack_waited``). The messages' leases are frozen
    when handed over; the rows stay leased until the ack commits, so an ordered queue's next
    message of a key waits for it. A failed ack (a lease lost meanwhile) is logged: the
    messages come back when their leases end and are published again under the same event
    ids (at least once, as a kill between publish and ack). The worker waits for them before
    its ``run()`` returns (``worker_stopped``); a SIGKILL loses none (they come back). The
    thread ends after ``ACKER_IDLE_SECONDS`` without work, closing its connections."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: list[_AckJob] = []
        #: per queue (label): acks handed over and not committed
        self._ahead: dict[str, int] = {}
        self._thread: threading.Thread | None = None

    def hand_over(
        self,
        model: type[Queue],
        confirmed: list[Message],
        archive_days: int,
        sent: _Sent,
        by: float,
    ) -> bool:
        """Run use: ack ``confirmed`` (with their archive rows when ``archive_days``) beside
        the queue's next run; they are the run's own acks (``mark_acked``: the worker acks
        them no more). False, and nothing handed over, when the queue's place among the
        outstanding acks is not free by ``by`` (``time.monotonic()``; the acks before are
        stuck): the run acks them itself."""
        if not confirmed:
            return True
        label = model._meta.label
        with self._cond:
            if not self._cond.wait_for(
                lambda: self._ahead.get(label, 0) < ACKS_AHEAD, max(by - time.monotonic(), 0.0)
            ):
                logger.warning(
                    "%s: the relay's acks before this run's did not commit in time; it acks "
                    "its %d message(s) itself",
                    label,
                    len(confirmed),
                    extra={"action": "relay_ack_waited", "queue": label},
                )
                return False
            # frozen once the queue's place is free: renewed while the run waits for it
            tokens = [held_lease_token(m) for m in confirmed]
            mark_acked(confirmed)
            self._ahead[label] = self._ahead.get(label, 0) + 1
            self._jobs.append(_AckJob(model, confirmed, tokens, sent, archive_days))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sq-relay-acks", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def flush(self, timeout: float = ACKS_FLUSH_SECONDS) -> bool:
        """Wait until every ack handed over has committed (or failed); False on ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._ahead, timeout)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._cond.wait_for(lambda: self._jobs, ACKER_IDLE_SECONDS):
                        self._thread = None
                        return
                    job = self._jobs.pop(0)
                try:
                    job.run()
                finally:
                    label = job.model._meta.label
                    with self._cond:
                        left = self._ahead[label] - 1
                        if left:
                            self._ahead[label] = left
                        else:
                            del self._ahead[label]
                        self._cond.notify_all()
        finally:
            connections.close_all()  # this thread's own


_acks = _Acks()


def flush_acks(**kwargs: Any) -> None:
    """``worker_stopped``'s receiver: wait for the acks the worker's relay runs handed over."""
    if not _acks.flush():
        logger.warning(
            "the relay's acks did not all commit within %g s of the worker's stop; the "
            "messages left are published again when their leases end",
            ACKS_FLUSH_SECONDS,
            extra={"action": "relay_ack_failed"},
        )


#: the archive's fields (each its column's name), in the order of ``_archive_rows``' values
ARCHIVE_FIELDS = ("id", "queue", "event_id", "key", "ordering_key", "data", "published_at")


def _archive_rows(
    model: type[Queue], confirmed: list[Message], database: str, sent: _Sent
) -> list[tuple]:
    """The archive row of each confirmed message (its published data and attributes, as
    ``sent`` holds them), as the database takes them: built before the ack's transaction,
    which then only sends them."""
    connection = connections[database]
    data = RelayedEvent._meta.get_field("data")
    at = RelayedEvent._meta.get_field("published_at").get_db_prep_save(clock.now(), connection)
    fields = ordering_fields(model)
    run = uuid.uuid4().hex[:24]  # random per run, then the row's place: one uuid4 a run
    rows = []
    for i, m in enumerate(confirmed):
        attributes, published = sent[id(m)]
        rows.append(
            (
                f"{run}{i:08x}",
                m.queue,
                attributes[EVENT_ID_ATTRIBUTE],
                attributes[KEY_ATTRIBUTE],
                _ordering_key(fields, m),
                data.get_db_prep_save(published, connection),
                at,
            )
        )
    return rows


def _archive(rows: list[tuple], database: str) -> None:
    """Insert the archive ``rows`` in the caller's transaction: one ``COPY`` where the driver
    has it (psycopg 3), else one ``INSERT`` of an array a column where the database takes them
    (PostgreSQL), else one ``executemany`` (the ORM's ``bulk_create`` compiled its statement
    per row: most of the archive's cost)."""
    connection = connections[database]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f) for f in ARCHIVE_FIELDS)  # each field's column is its name
    table = quote(RelayedEvent._meta.db_table)
    driver = driver_of(connection)
    if driver.supports_copy:  # (PostgreSQL, psycopg 3)
        with connection.cursor() as cursor, connection.wrap_database_errors:
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        return
    if driver.supports_array_parameters:  # one array a column (PostgreSQL)
        fields = {f.name: f for f in RelayedEvent._meta.concrete_fields}
        arrays = ", ".join(f"%s::{fields[f].db_type(connection)}[]" for f in ARCHIVE_FIELDS)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays})",
                [list(column) for column in zip(*rows, strict=True)],
            )
        return
    sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(ARCHIVE_FIELDS))})"
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


#: seconds between two prunes of the archive of one database by one process
ARCHIVE_PRUNE_EVERY_SECONDS = 3600.0
#: most archived events one prune statement deletes (a prune is a loop of such deletes)
ARCHIVE_PRUNE_BATCH = 1000
#: when this process last pruned each database's archive
_prunes = clock.Throttle()


def _prune_archive_if_due(model: type[Queue], days: int) -> None:
    """Prune the archive of ``model``'s database past ``days``, at most every
    ``ARCHIVE_PRUNE_EVERY_SECONDS`` in this process; a failure is logged, never raised."""
    database = engine_for(model).database
    if not _prunes.due(database, ARCHIVE_PRUNE_EVERY_SECONDS):
        return
    try:
        prune_archive(days, using=database)
    except Exception:
        logger.exception("pruning the relay's archive on %r failed", database)


def prune_archive(days: int, *, using: str) -> int:
    """Delete the archived events published more than ``days`` ago, ``ARCHIVE_PRUNE_BATCH`` at
    a time; returns how many went."""
    cutoff = clock.now() - timedelta(days=days)
    total = 0
    while True:
        ids = list(
            RelayedEvent.objects.using(using)
            .filter(published_at__lt=cutoff)
            .values_list("id", flat=True)[:ARCHIVE_PRUNE_BATCH]
        )
        if not ids:
            return total
        total += RelayedEvent.objects.using(using).filter(id__in=ids).delete()[0]


def register_relays(registry: ReceiverRegistry, queues: Sequence[type[Queue]]) -> None:
    """Register ``relay`` as the receiver of each of ``queues`` (non-atomic: it publishes
    outside any transaction, then the worker acks)."""
    size = pubsub_params().relay_batch_size
    worker_stopped.connect(flush_acks, dispatch_uid=f"{__name__}.flush_acks")
    for model in queues:
        registry.register(
            ReceiverSpec(
                func=relay,
                queue=model,
                name=f"{__name__}.relay[{model._meta.label}]",
                atomic=False,
                batch=True,
                max_batch_size=size,
                takes_context=True,
            )
        )
