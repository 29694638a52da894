"""Signals the verbs send once their writes commit, for the optional apps (the metrics app
counts them) and your own code. Connect a receiver as to any Django signal::

    from django.dispatch import receiver
    from spanner_queues.signals import messages_sent

    @receiver(messages_sent)
    def sent(sender, messages, using, **kwargs): ...

- ``messages_sent``: ``sender`` is the queue model, ``messages`` the sent ``Message`` list.
  Sent by ``send``, ``send_many``, ``replace``, the outbox, ``requeue`` (a dead letter, a
  replay), and the worker's re-sends (a ``Retry``; a message no receiver of it matches, or
  prefetched and not started at a stop, given back).
- ``messages_acked``: ``sender`` is the queue model, ``messages`` what the verb was given
  (``Message``, key mappings or key tuples). Sent by ``ack``, ``ack_many`` and ``requeue``, and
  by the worker's acks (a finished message, a ``Retry``'s or a give-back's ack-and-send, a
  discard): every committed ack once, whoever made it (a receiver's own ack is not made again
  by the worker). The one channel acks are counted on: the worker's events count none.

The app ``spanner_queues.contrib.pubsub`` sends five more (the metrics app counts them), from
the thread that did the work, once it is done (not on a commit):

- ``messages_published``: ``sender`` is the relayed queue model, ``messages`` the messages
  Pub/Sub confirmed, ``topic`` the topic path, ``lags`` the seconds from each message's send
  (its deliver time where the engine stores no send time) to the confirmation.
- ``publish_failed``: ``sender``, ``messages``, ``topic``, ``error`` (the exception) and
  ``refused`` (True: Pub/Sub refused them for good and they were dead-lettered; False: a
  failing Pub/Sub, they come back after the back-off).
- ``inbox_duplicates_dropped``: ``sender`` is the inbox queue model, ``count`` the pulled
  Pub/Sub messages dropped because their event was taken in before (within the window).
- ``inbox_pulled``: ``sender`` is the inbox queue model, ``count`` the Pub/Sub messages one
  pull returned (0 when none came within the wait).
- ``inbox_pull_failed``: ``sender`` is the inbox queue model, ``error`` the exception of a
  failed pull (no credentials, the subscription missing, Pub/Sub or the database failing);
  the puller tries again after a back-off.

The worker sends one of its own:

- ``worker_stopped``: ``sender`` is the ``Worker`` class, ``worker_id`` the worker's id. Sent by
  ``Worker.run`` in its thread once every run it started has settled and its threads ended,
  before it returns: work a receiver left in the background (the relay's acks) is finished
  by its receiver here, so a ``run()`` that returned leaves nothing behind.

Guarantees of the verbs' three: sent on commit, in the thread that committed
(``transaction.on_commit`` on ``using``), never for a transaction that rolls back, once for a
transaction retried after an abort; a receiver that raises is logged by ``django.dispatch``,
the others still run and the transaction stays committed. While no receiver is connected, the
verbs register no commit hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.dispatch import Signal

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine
    from spanner_queues.message import Message, OutgoingMessage
    from spanner_queues.models import Queue

__all__ = [
    "inbox_duplicates_dropped",
    "inbox_pull_failed",
    "inbox_pulled",
    "messages_acked",
    "messages_cancelled",
    "messages_published",
    "messages_sent",
    "publish_failed",
    "sends_dropped",
    "worker_stopped",
]

messages_sent = Signal(use_caching=True)
messages_acked = Signal(use_caching=True)
#: ``api.cancel``, inside its transaction: ``messages`` (one ``Message``), ``cancellation``
#: (the ``MessageCancellation``)
messages_cancelled = Signal(use_caching=True)
sends_dropped = Signal(use_caching=True)
messages_published = Signal(use_caching=True)
publish_failed = Signal(use_caching=True)
inbox_duplicates_dropped = Signal(use_caching=True)
inbox_pulled = Signal(use_caching=True)
inbox_pull_failed = Signal(use_caching=True)
worker_stopped = Signal()


def send_on_commit(signal: Signal, model: type[Queue], messages: Sequence[Any], using: str) -> None:
    """The verbs' side: ``signal`` for ``messages`` of ``model`` once the current transaction
    on ``using`` commits; nothing when there are none or nobody listens."""
    if messages and signal.has_listeners(model):
        messages = list(messages)  # (as the verb saw them, whatever the caller does next)
        transaction.on_commit(
            lambda: signal.send_robust(sender=model, messages=messages, using=using),
            using=using,
            robust=True,
        )


def requeued(
    engine: BaseQueueEngine,
    model: type[Queue],
    messages: Sequence[Message],
    outgoing: Sequence[OutgoingMessage],
    *,
    using: str,
    to: type[Queue] | None = None,
    missing_ok: bool = False,
) -> list[Message]:
    """ "Ack and send again", the one way (``api.requeue`` and the worker's ``DeliveryPolicy``):
    ``engine.requeue`` in the caller's transaction, with the verbs' signals on commit
    (``messages_sent`` for what was sent, ``messages_acked`` for what was acked; none for a
    ``missing_ok`` replace, which deletes whatever is there)."""
    sent = engine.requeue(model, messages, outgoing, using=using, to=to, missing_ok=missing_ok)
    send_on_commit(messages_sent, to or model, sent, using)
    if not missing_ok:
        send_on_commit(messages_acked, model, messages, using)
    return sent
