"""Every error spanner_queues raises derives from :class:`QueueError`.

Configuration mistakes also derive from Django's ``ImproperlyConfigured`` so that they read
like any other settings error. Control-flow signals for receivers (``Retry``) live here too.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "AckedFailure",
    "BurstFailed",
    "Cancelled",
    "CommitOutcomeUnknown",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidQueueEngine",
    "LeaseLost",
    "MessageAlreadyAcked",
    "MessageAlreadyExists",
    "MessageUpdateRefused",
    "NotSupportedByEngine",
    "OutboxBypassed",
    "PayloadError",
    "PayloadTooLarge",
    "QueueConfigurationError",
    "QueueError",
    "QueueUnavailable",
    "Retry",
    "StaleAck",
    "TimeLimitExceeded",
    "TransactionRequired",
    "UnknownQueue",
    "WorkerCrashed",
    "WorkerStuck",
]


class QueueError(Exception):
    """Root of every spanner_queues error."""


class QueueConfigurationError(QueueError, ImproperlyConfigured):
    """The ``SPANNER_QUEUES`` setting or a queue declaration is wrong."""


class InvalidQueueEngine(QueueConfigurationError):
    """An engine alias is unknown, or its ``ENGINE`` path cannot be imported."""


class UnknownQueue(QueueError, LookupError):
    """No declared queue has this name or label."""


class PayloadError(QueueError, ValueError):
    """A payload cannot be encoded (not bytes, str or JSON-serialisable)."""


class PayloadTooLarge(PayloadError):
    """A payload is larger than the engine's ``MAX_PAYLOAD_BYTES``."""


class InvalidArgument(QueueError, ValueError):
    """An argument of an API call, the ``Worker`` or a pattern helper is out of range or of the
    wrong type (``receive(max_messages=0)``, ``lease=-1``, ``concurrency=100000``...)."""


class InvalidMessage(QueueError, ValueError):
    """A message's key or deliver time is malformed (missing key column, naive datetime...)."""


class MessageAlreadyExists(QueueError):
    """A message with this key is already in the queue: keys are identity, as in Spanner."""


class Cancelled(QueueError):
    """Raised in a receiver whose message an operator cancelled (``api.cancel``) while it ran,
    by ``MessageContext.raise_if_cancelled()``: the worker acks the message (it is not retried)
    and reports the run as cancelled. ``reason`` and ``by`` are the cancellation's."""

    def __init__(self, reason: str = "", by: str = "") -> None:
        super().__init__(f"cancelled{f' by {by}' if by else ''}{f': {reason}' if reason else ''}")
        self.reason = reason
        self.by = by


class MessageAlreadyAcked(QueueError):
    """An ack found no message with this key: someone acked (or deleted) it first.

    The transaction that tried the ack must roll back; it must not go on as if it had acked.
    """


class CommitOutcomeUnknown(QueueError):
    """A commit's answer was lost (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``...) after it was
    sent: it may or may not have been applied. Nothing is known of its outcome; read the queue
    (or retry with the same keys, which fails with ``MessageAlreadyExists`` if it applied)."""


class LeaseLost(QueueError):
    """The lease token is unknown or expired: the message may already be someone else's."""


class StaleAck(LeaseLost):
    """An ack carried a lease token that no longer matches the message under its key: the lease
    expired and the message was delivered again, released, or replaced (``replace()``, a retry, a
    checkpoint) under the same key. Nothing was deleted; the transaction is marked for rollback.
    Raised by engines that check lease tokens on ack (the table engine)."""


class MessageUpdateRefused(QueueError, TypeError):
    """Queue rows cannot be updated: replace a message with ack + send instead."""


class QueueUnavailable(QueueError):
    """The database could not be reached (or did not answer) within the call's deadline; the
    call had no effect (it was a read)."""


class NotSupportedByEngine(QueueError, NotImplementedError):
    """The configured engine does not support this operation."""


class OutboxBypassed(QueueError):
    """``OutboxQuerySet`` refused ``bulk_create``/``update``/``bulk_update`` of a model
    registered with the outbox outside ``outbox.manual_send()``: the change would have no
    message."""


class TransactionRequired(QueueError):
    """The operation must run inside ``transaction.atomic()`` on the queue's database."""


class BurstFailed(QueueError):
    """A burst worker (``--burst``) gave up: a queue of it failed every receive for
    ``intake.BURST_GIVE_UP_SECONDS`` while nothing else was left to do (a missing table, a wrong
    database, a database down). What it had received was finished first; the queue's messages
    stay in it. ``runqueueworker --burst`` exits with status 1 instead of waiting for ever."""


class WorkerCrashed(QueueError):
    """A receiver raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``...): the worker stopped; ``__cause__`` is that exception. Its message
    was left leased and is delivered again after its lease."""


class TimeLimitExceeded(QueueError):
    """A receiver ran past its time limit (``@receiver(timeout=...)``, ``runqueueworker
    --timeout``). Raised inside the receiver's thread where Python can interrupt it, and by the
    worker when the receiver returns late: the delivery counts as a failed attempt, its
    transaction rolls back, and the message goes back to the queue. The worker's error names
    the receiver, the message and the limit; the interrupt itself (a class raised in another
    thread, so without arguments) says ``INTERRUPTED``."""

    INTERRUPTED = "the receiver ran past its time limit and was interrupted"

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (self.INTERRUPTED,)))


class WorkerStuck(QueueError):
    """A receiver stayed busy past its time limit and the grace after it (Python cannot
    interrupt a thread blocked in a C call): the worker stopped so that its supervisor can
    restart the process; ``runqueueworker`` exits with status 3. The stuck message's lease is no
    longer renewed, so it is delivered again."""


class AckedFailure(QueueError):
    """Raised by a non-atomic receiver that recorded its failure and acked its message in a
    transaction of its own (the Tasks runner, for a task that ``FAILED``): the worker reports
    the run as failed (logged with ``error``'s traceback, counted in ``failed``, a ``failed``
    event with ``acked=True``) and neither counts a delivery failure nor gives the message
    back. From an ``atomic`` receiver (whose ack rolled back with it) it is a plain failure.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        #: what the receiver's work raised
        self.error = error


class Retry(QueueError):
    """Raised by a receiver: ack the message and send it again under the same key, due later.

    ``Retry(after=timedelta(minutes=5))`` honours, for example, an HTTP ``Retry-After``.
    """

    def __init__(self, after: timedelta | float | None = None, *, reason: str = "") -> None:
        if after is not None and not isinstance(after, timedelta):
            after = timedelta(seconds=float(after))
        self.after: timedelta | None = after
        self.reason = reason
        super().__init__(
            reason or (f"retry after {after}" if after is not None else "retry after the back-off")
        )
