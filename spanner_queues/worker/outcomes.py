"""The value the delivery pipeline passes on: ``Outcome`` (how one delivery's run, or its try to
run, ended; its ``Kind``), and ``outcomes_of`` an error. The pipeline (``docs/explanation/
pipeline.md``): *run* (the worker's ``_run``, or ``testing.drain()``) turns deliveries into
outcomes; *decide* (``worker.decide``) turns an outcome into a settlement, a value; *apply*
(``worker.apply``) writes it through ``DeliveryPolicy`` and reports it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from spanner_queues.exceptions import (
    AckedFailure,
    Cancelled,
    LeaseLost,
    MessageAlreadyAcked,
    Retry,
    TimeLimitExceeded,
)

if TYPE_CHECKING:
    from spanner_queues.message import Message
    from spanner_queues.worker.slots import Delivery


class Kind(enum.Enum):
    """How one delivery's run (or its try to run) ended: what ``Outcomes.settle`` acts on."""

    #: the message is acked (by the worker in the run's transaction, or by the receiver)
    ACKED = "acked"
    #: ``raise Retry``: ack and send again under its key, due ``after`` later
    RETRY = "retried"
    #: the receiver raised: count the failure, give it back or give up on it
    FAILED = "failed"
    #: the receiver ran past its time limit: settled as ``FAILED``
    TIMED_OUT = "timed_out"
    #: the receiver could not be interrupted: the watchdog settles it as ``FAILED`` (the
    #: run's own ``FAILED``/``TIMED_OUT`` of a stuck delivery is then nothing more)
    STUCK = "stuck"
    #: the lease was lost (renewal, expiry, a stale ack): nothing is done to the message
    LEASE_LOST = "lease_lost"
    #: someone else acked the message while the receiver ran: reported
    ALREADY_ACKED = "already_acked"
    #: no receiver of this worker matches it: given back without spending an attempt
    UNMATCHED = "unmatched"
    #: delivered more often than ``max_attempts`` allows: not run, given up on
    EXHAUSTED = "exhausted"
    #: an operator cancelled it while it ran and the receiver stopped (``Cancelled``): acked,
    #: not retried
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The outcome of one delivery: a run returns one per message (a batch, one per message
    of the batch), and ``Outcomes.settle`` applies the delivery policy to it."""

    kind: Kind
    delivery: Delivery
    #: the receiver that ran (None: none ran)
    receiver: str | None = None
    #: seconds the receiver ran (None: it did not run, or the receiver acked it itself)
    duration: float | None = None
    #: what the run raised (``Retry``, the failure, ``LeaseLost``, ``NoReceiver``...)
    error: BaseException | None = None
    #: ``RETRY``: due this long from now (None: after the back-off)
    after: timedelta | None = None
    #: ``FAILED``: the receiver acked the message itself (``AckedFailure``): nothing is done
    acked: bool = False

    @property
    def message(self) -> Message:
        """The delivery's message."""
        return self.delivery.message

    @property
    def outcome(self) -> str:
        """The kind as text: ``"acked"``, ``"retried"``, ``"failed"`` (a time limit and a
        stuck run too), ``"lease_lost"``, ``"already_acked"``, ``"unmatched"``,
        ``"exhausted"``, ``"cancelled"``."""
        return "failed" if self.kind in FAILURES else self.kind.value


#: the kinds settled as a failed run (counted, then given back or given up on)
FAILURES = frozenset({Kind.FAILED, Kind.TIMED_OUT, Kind.STUCK})


def outcomes_of(
    error: Exception,
    deliveries: Sequence[Delivery],
    receiver: str,
    duration: float,
    *,
    atomic: bool,
) -> list[Outcome]:
    """The outcome of each of ``deliveries`` whose run raised ``error`` (procrastinate's
    ``get_retry_decision``): ``Retry``, a time limit, a lost lease (``StaleAck`` too), an ack
    by someone else, ``Cancelled``, ``AckedFailure`` of a non-atomic receiver, any other failure."""
    after: timedelta | None = None
    acked = False
    if isinstance(error, Retry):
        kind, after = Kind.RETRY, error.after
    elif isinstance(error, Cancelled):
        kind = Kind.CANCELLED
    elif isinstance(error, TimeLimitExceeded):
        kind = Kind.TIMED_OUT
    elif isinstance(error, LeaseLost):
        kind = Kind.LEASE_LOST
    elif isinstance(error, MessageAlreadyAcked):
        kind = Kind.ALREADY_ACKED
    elif isinstance(error, AckedFailure) and not atomic:  # failure recorded, acked
        cancelled = isinstance(error.error, Cancelled)  # (a Django task that stopped on one)
        kind = Kind.CANCELLED if cancelled else Kind.FAILED
        error, acked = error.error, True  # type: ignore[assignment]
    else:
        kind = Kind.FAILED
    return [Outcome(kind, d, receiver, duration, error, after, acked) for d in deliveries]
