"""*decide*: what becomes of one delivery, as a value (the pipeline's second station).

``decide`` is a pure function from an ``Outcome`` (with its queue's ``QueueOptions``, the
attempt the failure ledger counted, and the back-off) to a ``Settlement``: one case per
storage action. Exhaustion, dead letter or discard, and the back-off of a message no receiver
matched are decided here and nowhere else (Oban's ``normalize_state``, River's
``JobSetState*`` values); *apply* (``worker.apply``) writes what it says, and reports it.
No database, no threads, no clock: the caller passes ``now``.

=================  ===============================================================
settlement         storage action
=================  ===============================================================
``ACKED``          none: acked in the run's transaction (or by the receiver)
``REQUEUE``        ack and send again under its key, due ``due``, to this queue
``DEAD_LETTER``    ack and send again to the queue's dead-letter queue, due now
``RELEASE``        give it back before its lease ends, due ``due``
``DISCARD``        ack it (``discard_after_max_attempts``; a cancelled run)
``PARK``           give it back due at ``PARKED_UNTIL`` (its key clashes in the DLQ)
``NOTHING``        none (lease lost, acked meanwhile, a receiver that acked its failure)
=================  ===============================================================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING

from spanner_queues.exceptions import Retry
from spanner_queues.worker.outcomes import FAILURES, Kind, Outcome

if TYPE_CHECKING:
    from spanner_queues.options import QueueOptions

#: where a message whose key clashes in its dead-letter queue waits for an operator
PARKED_UNTIL = datetime(8999, 1, 1, tzinfo=dt_timezone.utc)


class Action(enum.Enum):
    """The storage action of a settlement (see the module docstring)."""

    ACKED = "acked"
    REQUEUE = "requeue"
    DEAD_LETTER = "dead_letter"
    RELEASE = "release"
    DISCARD = "discard"
    PARK = "park"
    NOTHING = "nothing"


@dataclass(frozen=True, slots=True)
class Settlement:
    """What *apply* does with one delivery: ``action``, and when it is next due (``REQUEUE``,
    ``RELEASE``, ``PARK``; ``DEAD_LETTER``: None, due now). ``report`` names the row of the
    report table (``events.REPORTS``) *apply* reports it with."""

    action: Action
    report: str
    due: datetime | None = None
    #: the failed attempt that exhausted it (``DEAD_LETTER``, ``DISCARD``, a ``RELEASE`` past
    #: ``max_attempts`` with neither configured)
    attempt: int | None = None


def exhausted(options: QueueOptions, attempt: int | None) -> bool:
    """Whether a run whose failure was counted as ``attempt`` was the last one allowed."""
    limit = options.max_attempts
    return bool(limit and attempt is not None and attempt >= limit)


def over_limit(options: QueueOptions, attempt: int | None) -> bool:
    """Whether a delivery numbered ``attempt`` was delivered more often than ``max_attempts``
    allows (runs lost to lease expiry count): it must not run again."""
    limit = options.max_attempts
    return bool(limit and (attempt or 0) > limit)


def give_up(options: QueueOptions, attempt: int | None, due: datetime) -> Settlement:
    """Past ``max_attempts``: dead-letter, discard, or (neither configured) release due at
    ``due`` (after the back-off)."""
    if options.dead_letter_queue:
        return Settlement(Action.DEAD_LETTER, "dead_lettered", attempt=attempt)
    if options.discard_after_max_attempts:
        return Settlement(Action.DISCARD, "discarded", attempt=attempt)
    return Settlement(Action.RELEASE, "released", due=due, attempt=attempt)


def park() -> Settlement:
    """The dead-letter queue already holds the message's key: park it in its queue."""
    return Settlement(Action.PARK, "dead_letter_clash", due=PARKED_UNTIL)


def decide(
    outcome: Outcome,
    options: QueueOptions,
    *,
    now: datetime,
    backoff: timedelta,
    attempt: int | None = None,
    lease_held: bool = True,
) -> Settlement:
    """The settlement of ``outcome``. ``backoff``: the wait after this delivery's attempt
    (for ``UNMATCHED``, after its misses); ``attempt``: of a failure, the attempt the ledger
    counted (the delivery's own where it keeps none); ``lease_held``: False once the lease was
    lost (then nothing is written)."""
    kind = outcome.kind
    if kind is Kind.ACKED:
        return Settlement(Action.ACKED, "acked")
    if kind in (Kind.LEASE_LOST, Kind.ALREADY_ACKED):
        return Settlement(Action.NOTHING, kind.value)
    if not lease_held:
        return Settlement(Action.NOTHING, "lease_lost")
    if kind is Kind.RETRY:
        after = outcome.error.after if isinstance(outcome.error, Retry) else None
        return Settlement(
            Action.REQUEUE, "retried", due=now + (backoff if after is None else after)
        )
    if kind is Kind.UNMATCHED:
        return Settlement(Action.REQUEUE, "unmatched", due=now + backoff)
    if kind is Kind.CANCELLED:  # the receiver stopped on an operator's cancel: not retried
        if outcome.acked:  # (the Tasks runner acked it with its result)
            return Settlement(Action.NOTHING, "cancelled")
        return Settlement(Action.DISCARD, "cancelled")
    if kind is Kind.EXHAUSTED:
        return give_up(options, attempt, now + backoff)
    assert kind in FAILURES
    if outcome.acked:  # the receiver acked its message and failed (the Tasks runner)
        return Settlement(Action.NOTHING, "failed")
    if exhausted(options, attempt):
        return give_up(options, attempt, now + backoff)
    return Settlement(Action.RELEASE, "released", due=now + backoff)
