"""Operator controls that every worker obeys: pause and resume a queue, and the shared rate
limit of a queue (``QueueMeta.rate_limit``), and the record of cancelled messages.

A pause is a row (``PausedQueue``) in the queue's own database, so it holds for every worker
process at once and survives restarts. Sends are still accepted while a queue is paused; workers
stop receiving from it within ``PAUSE_CHECK_SECONDS`` (they read the paused set once per that
interval, one query per database) and start again by themselves once it is resumed. Messages
already running finish; messages a native stream had leased and not yet started go back to the
queue (the worker stops that stream).

Spanner's own ``ALTER QUEUE ... SET OPTIONS (disable_delivery = true)`` is not used: it is a
schema change (a long-running operation that needs DDL rights), it stops every consumer of the
queue, not only this app's workers, and Google documents nothing more of it than its name.

The rate limit is a GCRA bucket (one row per queue, ``QueueRate``): ``take_starts`` hands out
up to ``n`` starts in one short read-write transaction (a compare-and-set on the row, safe on
every database), at most ``rate`` per second on average with bursts of one second's worth.

A cancellation (``api.cancel``) is a row (``MessageCancellation``: queue, key, who, why, when)
in the queue's database. A pending message is deleted in the same transaction; a running one
stays, and every worker reads the cancellations of the messages it runs once per
``CANCEL_CHECK_SECONDS`` (one query per database, bound to the keys it holds) and tells their
receivers (``MessageContext.cancelled``). A cancellation applies to the message sent under its
key before it was made, not to one sent again later. Records are kept ``CANCELLATION_KEEP_DAYS``
(30): ``api.cancel`` deletes older ones, at most ``CANCELLATION_PRUNE_BATCH`` at a time and once
an hour per process and database, so the table stays bounded by the cancels of a month. A
message still retried after its running cancellation's record went is no longer asked to stop
(its receiver runs on: a late retry, never a lost message).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import IntegrityError, models

from spanner_queues import clock
from spanner_queues.engines import engine_for
from spanner_queues.failures import key_text
from spanner_queues.queues import get_queue
from spanner_queues.transactions import maintain_if_due, run_in_transaction

if TYPE_CHECKING:
    from spanner_queues.models import Queue

__all__ = [
    "CANCELLATION_KEEP_DAYS",
    "CANCEL_CHECK_SECONDS",
    "PAUSE_CHECK_SECONDS",
    "MessageCancellation",
    "PausedQueue",
    "QueueRate",
    "cancellations",
    "is_paused",
    "pause",
    "paused",
    "prune_cancellations",
    "resume",
    "take_starts",
]


#: how often a worker reads which of its queues are paused: the bound on how long it may go on
#: receiving from a queue after ``pause`` (plus the receive call under way).
PAUSE_CHECK_SECONDS = 2.0


class PausedQueue(models.Model):
    """A paused queue: no worker receives from it while this row exists."""

    queue = models.CharField(max_length=200, primary_key=True)
    paused_at = models.DateTimeField()
    reason = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = "paused queue"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.queue} paused at {self.paused_at:%Y-%m-%d %H:%M:%S}"


def _where(queue: str | type[Queue], using: str | None) -> tuple[str, str]:
    model = get_queue(queue)
    return model._meta.label, using or engine_for(model).database


def pause(queue: str | type[Queue], *, reason: str = "", using: str | None = None) -> bool:
    """Pause ``queue`` for every worker; True if it was running, False if already paused.
    Committed at once (or with the caller's transaction, inside one)."""
    label, db = _where(queue, using)

    def run() -> bool:
        if PausedQueue.objects.using(db).filter(queue=label).exists():
            return False
        PausedQueue.objects.using(db).create(
            queue=label, paused_at=clock.now(), reason=str(reason)[:1000]
        )
        return True

    try:
        return run_in_transaction(run, using=db)
    except IntegrityError:  # paused by someone else at the same moment
        return False


def resume(queue: str | type[Queue], *, using: str | None = None) -> bool:
    """Resume ``queue``; True if it was paused. Workers receive from it again within
    ``PAUSE_CHECK_SECONDS``."""
    label, db = _where(queue, using)
    return run_in_transaction(
        lambda: PausedQueue.objects.using(db).filter(queue=label).delete()[0] > 0, using=db
    )


def is_paused(queue: str | type[Queue], *, using: str | None = None) -> bool:
    """Whether ``queue`` is paused now."""
    label, db = _where(queue, using)
    return PausedQueue.objects.using(db).filter(queue=label).exists()


def paused(queues: Iterable[type[Queue]]) -> dict[str, PausedQueue]:
    """The paused ones among ``queues``, by label: one read per database."""
    by_db: dict[str, list[str]] = {}
    for model in queues:
        by_db.setdefault(engine_for(model).database, []).append(model._meta.label)
    found: dict[str, PausedQueue] = {}
    for db, labels in by_db.items():
        for row in PausedQueue.objects.using(db).filter(queue__in=labels):
            found[row.queue] = row
    return found


# --- the shared rate limit -------------------------------------------------------------------
#: the burst a rate-limited queue allows, in seconds' worth of its rate
RATE_BURST_SECONDS = 1.0
#: how far past this rate's furthest next start a row's may be (another worker's clock, or
#: its transaction committed after this one read the time) before it counts as another rate's
#: (on PostgreSQL two workers' rows were 7 ms past it)
RATE_CHANGE_SLACK = timedelta(seconds=5)


class QueueRate(models.Model):
    """The rate-limit bucket of one queue: the theoretical time of its next start (GCRA)."""

    queue = models.CharField(max_length=200, primary_key=True)
    next_start = models.DateTimeField()

    class Meta:
        verbose_name = "queue rate"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.queue}: next start at {self.next_start:%H:%M:%S.%f}"


class _Raced(Exception):
    """Another worker moved the bucket between this one's read and its write."""


def take_starts(
    queue: str | type[Queue], wanted: int, rate: float, *, using: str | None = None
) -> tuple[int, datetime]:
    """Take up to ``wanted`` starts of ``queue`` at ``rate`` per second, shared by every
    worker; returns ``(granted, when the next start is free)``. One read-write transaction.

    A changed ``rate`` takes effect at once: a next start later than this rate can have set
    (``RATE_BURST_SECONDS`` plus one step ahead, plus ``RATE_CHANGE_SLACK`` for the clocks and
    transactions of other workers) was set by another rate and is dropped, and the bucket
    starts afresh with this rate's burst."""
    label, db = _where(queue, using)
    step = 1.0 / rate
    burst = timedelta(seconds=RATE_BURST_SECONDS)

    def run() -> tuple[int, datetime]:
        now = clock.now()
        rows = QueueRate.objects.using(db)
        row = rows.filter(queue=label).first()
        due = max(row.next_start, now) if row is not None else now
        if due > now + burst + timedelta(seconds=step) + RATE_CHANGE_SLACK:
            due = now  # another rate's schedule
        room = (now + burst - due).total_seconds()
        # start i (from 0) is due at due + i * step; those due within the burst go now
        granted = 0 if room <= 0 else min(wanted, math.ceil(room / step - 1e-9))
        after = due + timedelta(seconds=granted * step)
        if granted:
            if row is None:
                rows.create(queue=label, next_start=after)
            elif rows.filter(queue=label, next_start=row.next_start).update(next_start=after) != 1:
                raise _Raced
        return granted, max(after - burst, now)

    for _ in range(20):
        try:
            return run_in_transaction(run, using=db)
        except (_Raced, IntegrityError):
            continue
    return 0, clock.now() + timedelta(seconds=step)


# --- cancellations ---------------------------------------------------------------------------
#: how often a worker reads the cancellations of the messages it runs: the bound on how long a
#: running receiver goes on before ``context.cancelled`` turns True (plus its next check).
CANCEL_CHECK_SECONDS = 1.0
#: keys one read of the cancellations binds (Spanner binds at most 950 parameters a statement)
CANCEL_READ_BATCH = 500
#: days a cancellation's record is kept (the admin's record of who and why)
CANCELLATION_KEEP_DAYS = 30
#: records one prune deletes at most (one transaction: Spanner's mutations per commit)
CANCELLATION_PRUNE_BATCH = 500
#: seconds between two prunes of one database by this process
CANCELLATION_PRUNE_EVERY_SECONDS = 3600.0
#: when this process last pruned each database's cancellations
_prunes = clock.Throttle()


class MessageCancellation(models.Model):
    """A message an operator cancelled (``api.cancel``): deleted while pending (``running``
    False), or asked to stop while a worker ran it (``running`` True)."""

    queue = models.CharField(max_length=200)
    message_key = models.CharField(max_length=1000)
    reason = models.TextField(blank=True, default="")
    by = models.CharField(max_length=200, blank=True, default="")
    cancelled_at = models.DateTimeField()
    #: the message was leased (running, or about to) when it was cancelled: not deleted, its
    #: receiver asked to stop
    running = models.BooleanField(default=False)

    class Meta:
        verbose_name = "message cancellation"
        default_permissions = ()
        indexes = [models.Index(fields=["queue", "message_key"], name="sq_cancellation_key")]

    def __str__(self) -> str:
        return f"{self.queue} {self.message_key} cancelled at {self.cancelled_at:%Y-%m-%d %H:%M:%S}"


def cancellations(
    messages: Sequence[tuple[str, Sequence[object], datetime | None, datetime]], *, using: str
) -> dict[tuple[str, str], MessageCancellation]:
    """The cancellations on database ``using`` of held messages (``(queue label, key, send
    time, received at)``), by ``(queue, key_text(key))``: of each, the latest that applies to
    it. One that left the message (``running``) applies if made at or after it was sent (None:
    unknown, it applies); one that deleted it, if made at or after it was received (the
    message held then was the one deleted; a message sent again since is another). One read
    per ``CANCEL_READ_BATCH`` messages."""
    held = {(q, key_text(k)): (sent, received) for q, k, sent, received in messages}
    found: dict[tuple[str, str], MessageCancellation] = {}
    items = sorted(held)
    for i in range(0, len(items), CANCEL_READ_BATCH):
        chunk = items[i : i + CANCEL_READ_BATCH]
        # (no older cancellation applies: the read stays bounded for a key used again and again)
        oldest = min(min(t for t in held[w] if t is not None) for w in chunk)
        rows = MessageCancellation.objects.using(using).filter(
            queue__in={q for q, _ in chunk},
            message_key__in={k for _, k in chunk},
            cancelled_at__gte=oldest,
        )
        for row in rows.order_by("cancelled_at"):
            where = (row.queue, row.message_key)
            if where not in held:
                continue
            sent, received = held[where]
            since = (sent if row.running else received) or row.cancelled_at
            if row.cancelled_at >= since:
                found[where] = row
    return found


def prune_cancellations(*, using: str, days: int = CANCELLATION_KEEP_DAYS) -> int:
    """In the caller's transaction (or one of its own): delete up to
    ``CANCELLATION_PRUNE_BATCH`` records made more than ``days`` days ago, the oldest first;
    how many went."""
    records = MessageCancellation.objects.using(using)
    cutoff = clock.now() - timedelta(days=days)
    old = list(
        records.filter(cancelled_at__lt=cutoff)
        .order_by("cancelled_at")
        .values_list("pk", flat=True)[:CANCELLATION_PRUNE_BATCH]
    )
    if not old:
        return 0
    deleted: tuple[int, dict[str, int]] = records.filter(pk__in=old).delete()
    return deleted[0]


def prune_cancellations_if_due(using: str) -> None:
    """``prune_cancellations`` of ``using`` in a transaction of its own, if this process has
    not pruned it in the last ``CANCELLATION_PRUNE_EVERY_SECONDS`` and the caller is in no
    transaction; best effort (a failure is logged, the next cancel an hour later tries
    again)."""
    maintain_if_due(
        using,
        _prunes,
        CANCELLATION_PRUNE_EVERY_SECONDS,
        lambda: run_in_transaction(lambda: prune_cancellations(using=using), using=using),
        "pruning the cancellations",
    )
