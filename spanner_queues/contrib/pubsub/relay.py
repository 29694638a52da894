"""The relay: a batch receiver of each relayed queue (``QueueMeta.pubsub_topic``), registered
by the app's ``ready()``, run by ``runqueueworker`` like any receiver (leases renewed, SIGTERM
drains, ``--burst``, health and metrics).

One run publishes a batch with Google's client (its batching), waits for every confirmation,
and returns: the worker then acks the batch. So a message leaves its queue only after Pub/Sub
confirmed it. A message Pub/Sub refuses for good (too large, bad attributes) is moved to the
queue's dead-letter queue; when Pub/Sub fails (unreachable, topic missing, a timeout), the
confirmed messages are acked and the run raises ``PublishFailed``: the rest come back after the
worker's back-off. Ordering keys paused by a failed publish are resumed before it raises.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spanner_queues import api, clock
from spanner_queues.contrib.pubsub.conf import (
    MAX_ORDERING_KEY_BYTES,
    PubSubUnavailable,
    ordering_fields,
    pubsub_params,
    resource_path,
)
from spanner_queues.deadletter import dead_letter
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import QueueError
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.receivers import MessageContext, ReceiverRegistry, ReceiverSpec
from spanner_queues.signals import messages_published, publish_failed
from spanner_queues.transactions import run_in_transaction

try:
    from google.api_core import exceptions as google_exceptions
    from google.cloud.pubsub_v1 import PublisherClient, types
    from google.cloud.pubsub_v1.publisher import exceptions as publisher_exceptions
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
#: Pub/Sub's limit on an attribute value (https://cloud.google.com/pubsub/quotas)
MAX_ATTRIBUTE_BYTES = 1024

#: errors that mean Pub/Sub will never take this message: dead-lettered, not retried
REFUSED = (
    google_exceptions.InvalidArgument,
    google_exceptions.FailedPrecondition,
    publisher_exceptions.MessageTooLargeError,
    TypeError,
    ValueError,
)


class PublishFailed(QueueError):
    """Pub/Sub did not confirm some messages of a relay run (unreachable, a missing topic or
    permission, a timeout): they are given back and published again after the back-off."""


def event_id(message: Message) -> str:
    """The event id of a sent message: the same on every publish of it. On an envelope queue it
    is the CloudEvent's own ``id`` (new for every send); elsewhere a digest of the queue, the
    key and the stored payload, which no receive, renewal or release changes."""
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


def key_text(message: Message) -> str:
    """The message key as the ``key`` attribute: a JSON array of its values."""
    return json.dumps(list(message.key), default=str, separators=(",", ":"))


def ordering_key(model: type[models.Model], message: Message) -> str:
    """The message's ordering key ("" for none): its ordering fields' values joined by "/"."""
    return _ordering_key(ordering_fields(model), message)


def _ordering_key(fields: tuple[str, ...], message: Message) -> str:
    if not fields:
        return ""
    values = message.key_dict
    text = "/".join(str(values.get(name, values.get(f"{name}_id"))) for name in fields)
    return text if len(text.encode()) <= MAX_ORDERING_KEY_BYTES else ""


#: the relay's client batches: up to Pub/Sub's 1,000 messages a publish request (the client's
#: default is 100); bytes and latency are the client's defaults (1 MB, 10 ms)
BATCH_SETTINGS = types.BatchSettings(max_messages=1000)
#: ordering on: messages with an ordering key are published in order, one batch in flight per key
PUBLISHER_OPTIONS = types.PublisherOptions(enable_message_ordering=True)

_client: PublisherClient | None = None
_client_lock = threading.Lock()


def publisher() -> PublisherClient:
    """This process's publisher (one, thread-safe; ``PUBSUB_EMULATOR_HOST`` is the client's)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = PublisherClient(
                batch_settings=BATCH_SETTINGS, publisher_options=PUBLISHER_OPTIONS
            )
        return _client


def relay(context: MessageContext, messages: list[Message]) -> None:
    """Publish ``messages`` of a relayed queue and wait for Pub/Sub's confirmations (see the
    module docstring for what follows a refusal or a failure)."""
    model = context.queue
    params = pubsub_params()
    topic = resource_path("topics", str(queue_options(model).pubsub_topic), params)
    client = publisher()
    pending = _publish_all(client, topic, params.publish_timeout, model, messages)
    confirmed, refused, failed = _await_confirmations(pending, params.publish_timeout)
    _report_confirmed(model, topic, confirmed)
    for m, error in refused:
        _dead_letter_refused(model, topic, m, error)
    if not failed:
        return  # the worker acks the confirmed ones (the dead-lettered are acked)
    _give_back(client, model, topic, messages, confirmed, failed)


#: a publish under way: the message, its ordering key, and the client's future (or the error
#: that kept it from being sent)
_Pending = tuple[Message, str, Any]


def _publish_all(
    client: PublisherClient,
    topic: str,
    timeout: float,
    model: type[Queue],
    messages: list[Message],
) -> list[_Pending]:
    """Hand every message to the client without waiting; one entry per message. A message the
    client refuses before sending it (too large, a bad value) carries its error instead of a
    future."""
    fields = ordering_fields(model)
    keys = [_ordering_key(fields, m) for m in messages]
    pending: list[_Pending] = []
    # Each ordering key's messages one after the other, in their order (a stable sort): the
    # client then fills one batch per key, where messages interleaved by key (as a claim
    # returns them) were cut into a publish request every few messages by its 10 ms timer.
    for i in sorted(range(len(messages)), key=keys.__getitem__):
        m, key = messages[i], keys[i]
        try:
            future: Any = _publish_one(client, topic, timeout, m, key)
        except Exception as exc:  # refused before it was sent (too large, a bad value)
            future = exc
        pending.append((m, key, future))
    return pending


def _publish_one(client: PublisherClient, topic: str, timeout: float, m: Message, key: str) -> Any:
    """Publish one message with the relay's attributes and return the client's future; raises
    ``ValueError`` for an attribute Pub/Sub would refuse."""
    attributes = {
        EVENT_ID_ATTRIBUTE: event_id(m),
        QUEUE_ATTRIBUTE: m.queue,
        KEY_ATTRIBUTE: key_text(m),
    }
    too_long = [a for a, v in attributes.items() if len(v.encode()) > MAX_ATTRIBUTE_BYTES]
    if too_long:  # Pub/Sub would refuse it (its emulator takes it: checked here)
        raise ValueError(f"attribute {too_long[0]!r} is over Pub/Sub's {MAX_ATTRIBUTE_BYTES} bytes")
    # retry=None: with ordering on, the client would retry for ever; the worker's
    # back-off retries instead, and nothing piles up in the client while Pub/Sub fails
    return client.publish(
        topic,
        m.stored_payload,  # on an envelope queue the whole event, traceparent included
        ordering_key=key,
        retry=None,
        timeout=timeout,
        **attributes,
    )


def _await_confirmations(
    pending: list[_Pending], timeout: float
) -> tuple[
    list[Message], list[tuple[Message, BaseException]], list[tuple[Message, str, BaseException]]
]:
    """Wait for every publish and sort the messages: confirmed by Pub/Sub, refused for good
    (``REFUSED``: dead-lettered), or failed (given back, with their ordering key)."""
    confirmed: list[Message] = []
    refused: list[tuple[Message, BaseException]] = []
    failed: list[tuple[Message, str, BaseException]] = []
    for m, key, future in pending:
        if isinstance(future, BaseException):
            error: BaseException = future
        else:
            try:
                future.result(timeout=timeout)
            except Exception as exc:
                error = exc
            else:
                confirmed.append(m)
                continue
        if isinstance(error, REFUSED):
            refused.append((m, error))
        else:
            failed.append((m, key, error))
    return confirmed, refused, failed


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
    client: PublisherClient,
    model: type[Queue],
    topic: str,
    messages: list[Message],
    confirmed: list[Message],
    failed: list[tuple[Message, str, BaseException]],
) -> None:
    """After a failed publish: resume the paused ordering keys, ack the confirmed messages (they
    are in Pub/Sub; only the failed ones come back), send ``publish_failed`` and raise
    ``PublishFailed`` from the first error. Always raises."""
    for key in {key for _, key, _ in failed if key}:
        client.resume_publish(topic, key)
    if confirmed:  # they are in Pub/Sub: only the others come back
        engine = engine_for(model)
        run_in_transaction(
            lambda: api.ack_many(model, confirmed),
            using=engine.database,
            retries=engine.params.transaction_retries,
        )
    first = failed[0][2]
    publish_failed.send_robust(
        model, messages=[m for m, _, _ in failed], topic=topic, error=first, refused=False
    )
    raise PublishFailed(
        f"{len(failed)} of {len(messages)} message(s) of {model._meta.label} not confirmed by "
        f"Pub/Sub ({topic}): {type(first).__name__}: {first}"
    ) from first


def register_relays(registry: ReceiverRegistry, queues: Sequence[type[Queue]]) -> None:
    """Register ``relay`` as the receiver of each of ``queues`` (non-atomic: it publishes
    outside any transaction, then the worker acks)."""
    size = pubsub_params().relay_batch_size
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
