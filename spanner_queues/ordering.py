"""Ordered per key (``QueueMeta.ordered_by``): each ordering key's messages are delivered one
at a time, in send order.

A queue declares ``ordered_by = ("customer",)``: the names of its key fields, a prefix of the
queue's key (the last key field names the message within its key). Messages whose values of
these fields are equal share an ordering key. Send order is the order the senders' transactions
gave them: every send of an ordering key takes the key's row in ``KeySequence`` (one row per
queue and ordering key, written in the sender's transaction, never ``on_commit``), so two
concurrent senders of one key serialise on it (PostgreSQL waits on its row lock, Spanner aborts
one of them and the retry sees the other's, SQLite has one writer), and each message gets the
key's next ``send_time`` (strictly later than the key's last one, by a microsecond at least).
The table engine's claim hands out only a key's head: a due message of the key no earlier
message of which still exists, leased, backing off, or not yet due
(``RowStatements``: one ``NOT EXISTS`` on the same table). A message that failed stays in its
queue (released after the back-off, or given back under its key with its own ``send_time`` by a
retry or an unmatched delivery), so it holds back its key, and only its key, until it is acked,
dead-lettered or discarded: dead-lettering or discarding the head lets the next one go.

The ``KeySequence`` rows outlive the messages: they are what keeps the next send of a key
after its last one. A row whose key sent nothing for ``KEY_RETENTION`` (a day) is deleted by the
worker (``prune_if_due``, at most hourly per database and process): the next send of that key
takes the current time, later than any message of the key still queued, as the row would have
given it (a key that sends again within a microsecond of its last send is what the row is for).
So the table holds the keys of the last day, not every key ever sent (an inbox ordered by
Pub/Sub ordering key, a queue ordered by order id).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models, transaction
from django.db.models import F

from spanner_queues import clock
from spanner_queues.keys import column_field, key_fields, key_names
from spanner_queues.options import ordered_by
from spanner_queues.transactions import maintain_if_due
from spanner_queues.uniqueness import key_text  # (the send-once ledger's text of a key)

if TYPE_CHECKING:
    from spanner_queues.message import Message, OutgoingMessage

#: the least step between two send times of one ordering key
TICK = timedelta(microseconds=1)
#: a ``KeySequence`` row whose key sent nothing for this long is deleted (``prune``)
KEY_RETENTION = timedelta(days=1)
#: seconds between two prunes of one database's rows by one process
PRUNE_EVERY_SECONDS = 3600.0
#: rows one prune statement deletes at most (Spanner binds at most 950 parameters), and the
#: statements one prune sends at most (18,000 rows an hour)
PRUNE_BATCH = 900
PRUNE_BATCHES = 20
#: when this process last pruned each database's rows
_prunes = clock.Throttle()


class KeySequence(models.Model):
    """One ordering key of an ordered queue: how many messages were sent under it and the
    ``send_time`` of the last one (a send of the key takes the next)."""

    #: ``sequence_id(queue, ordering key text)``: one id column, the same on every database
    id = models.CharField(primary_key=True, max_length=64)
    #: the queue's label
    queue = models.CharField(max_length=200)
    #: messages sent under the key (the last one's number in the key's sequence)
    sent = models.BigIntegerField(default=0)
    #: the ``send_time`` of the last message sent under the key
    last_sent = models.DateTimeField(null=True)

    class Meta:
        verbose_name = "ordering key of an ordered queue"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.queue}: {self.sent} sent"


def sequence_id(queue: str, ordering_key: Sequence[Any]) -> str:
    """The ``KeySequence`` id of ``ordering_key`` (its values) in the queue labelled
    ``queue``."""
    text = key_text(list(ordering_key))
    return hashlib.sha256(f"{queue}\0{text}".encode()).hexdigest()


def send_times(
    model: type[models.Model],
    messages: Sequence[OutgoingMessage],
    now: datetime,
    *,
    using: str,
) -> list[datetime]:
    """In the caller's transaction on ``using`` (which the caller opened: the row locks must
    last until its commit): the ``send_time`` of each of ``messages``, in the order given,
    each later than the last one sent under its ordering key; the ``KeySequence`` rows
    updated. A message that carries its own ``send_time`` (given back under its key by a
    retry) keeps it and takes no new place."""
    names = ordered_by(model)
    label = model._meta.label
    ids = [sequence_id(label, [m.key[n] for n in names]) for m in messages]
    fresh = [i for i, m in zip(ids, messages, strict=True) if m.send_time is None]
    counts: dict[str, int] = {}
    for i in fresh:
        counts[i] = counts.get(i, 0) + 1
    rows = KeySequence.objects.using(using)
    missing = []
    # the UPDATE first: it takes the row's lock, so the read below sees the last sender's
    for pk, n in sorted(counts.items()):
        if not rows.filter(pk=pk).update(sent=F("sent") + n):
            missing.append(pk)
    if missing:
        # a concurrent first send of the key: an IntegrityError, or Spanner aborts one
        rows.bulk_create(
            [KeySequence(pk=pk, queue=label, sent=counts[pk]) for pk in missing],
            ignore_conflicts=connections[using].features.supports_ignore_conflicts,
        )
    last: dict[str, datetime | None] = dict(
        rows.filter(pk__in=sorted(counts)).values_list("pk", "last_sent")
    )
    out = []
    for pk, m in zip(ids, messages, strict=True):
        if m.send_time is not None:
            out.append(m.send_time)
            continue
        before = last.get(pk)
        at = now if before is None or before < now else before + TICK
        last[pk] = at
        out.append(at)
    for pk in sorted(counts):
        rows.filter(pk=pk).update(last_sent=last[pk])
    return out


def prune_if_due(using: str) -> None:
    """``prune`` the ``KeySequence`` rows of ``using``, at most every ``PRUNE_EVERY_SECONDS``
    in this process and never inside a caller's transaction; a failure is logged, never
    raised (the next one an interval later tries again)."""
    maintain_if_due(
        using, _prunes, PRUNE_EVERY_SECONDS, lambda: prune(using=using), "pruning the ordering keys"
    )


def prune(*, using: str, now: datetime | None = None) -> int:
    """Delete the ``KeySequence`` rows of ``using`` whose key sent nothing since ``now`` less
    ``KEY_RETENTION`` (up to ``PRUNE_BATCH`` rows a transaction, ``PRUNE_BATCHES`` of them);
    how many were deleted. A send of such a key meanwhile updates its row's ``last_sent``,
    which the ``DELETE`` checks again: its row stays."""
    cutoff = (now or clock.now()) - KEY_RETENTION
    rows = KeySequence.objects.using(using)
    deleted = 0
    for _ in range(PRUNE_BATCHES):
        with transaction.atomic(using=using):
            pks = list(rows.filter(last_sent__lt=cutoff).values_list("pk", flat=True)[:PRUNE_BATCH])
            if pks:
                rows.filter(pk__in=pks, last_sent__lt=cutoff).delete()
        deleted += len(pks)
        if len(pks) < PRUNE_BATCH:
            break
    return deleted


def head_of_key(model: type[models.Model]) -> Any:
    """The ORM condition "no earlier message of this ordering key exists" on ``model``'s rows
    (None: the queue is not ordered)."""
    names = ordered_by(model)
    if not names:
        return None
    earlier = model._base_manager.filter(
        **{n: models.OuterRef(n) for n in names}, send_time__lt=models.OuterRef("send_time")
    )
    return ~models.Exists(earlier)


def head_of_key_sql(model: type[models.Model], using: str) -> str:
    """``head_of_key`` as SQL for the table engine's hand-written claim (empty: not
    ordered)."""
    names = ordered_by(model)
    if not names:
        return ""
    quote = connections[using].ops.quote_name
    table = quote(model._meta.db_table)
    fields = {f.attname: f for f in key_fields(model)}
    sent = quote(column_field(model, "send_time").column)
    same = " AND ".join(
        f"e.{quote(fields[n].column)} = {table}.{quote(fields[n].column)}" for n in names
    )
    return f"NOT EXISTS (SELECT 1 FROM {table} e WHERE {same} AND e.{sent} < {table}.{sent})"


# --- engines whose receive has no order (native queues): the worker keeps it ------------------

#: ids one statement names at most (Spanner binds at most 950 parameters a statement)
CHUNK = 900
#: how long a message that is not its key's head waits before it is delivered again (given
#: back under its key, keeping its place: it never ran, so no attempt is spent) the first
#: time; each wait doubles it, up to ``MAX_WAIT_SECONDS``
WAIT_SECONDS = 1.0
MAX_WAIT_SECONDS = 30.0


def wait(waits: int) -> timedelta:
    """The wait of a message given back behind its key's head for the ``waits``-th time."""
    return timedelta(seconds=min(WAIT_SECONDS * 2 ** min(max(waits, 1) - 1, 16), MAX_WAIT_SECONDS))


class OrderedMessage(models.Model):
    """A message of an ordered queue on an engine whose ``receive`` hands out messages in no
    order (native queues: ``supports_ordered_receive`` False): its place in its key's order.
    Written with the message, deleted with it (ack, dead letter, discard, delete)."""

    #: ``message_row_id(queue, key)``
    id = models.CharField(primary_key=True, max_length=64)
    #: the queue's label
    queue = models.CharField(max_length=200)
    #: the ``KeySequence`` id of the message's ordering key
    sequence = models.CharField(max_length=64)
    #: its send time: its place among its key's messages
    sent_at = models.DateTimeField()

    class Meta:
        verbose_name = "place of a message of an ordered queue"
        default_permissions = ()
        indexes = [models.Index(fields=["sequence", "sent_at"], name="sq_ordered_place")]

    def __str__(self) -> str:
        return f"{self.queue}: sent at {self.sent_at:%Y-%m-%d %H:%M:%S.%f}"


def message_row_id(queue: str, key: Sequence[Any]) -> str:
    """The ``OrderedMessage`` id of the message under ``key`` (its values) in ``queue``."""
    text = key_text(list(key))
    return hashlib.sha256(f"{queue}\0message\0{text}".encode()).hexdigest()


def record_places(
    model: type[models.Model],
    messages: Sequence[OutgoingMessage],
    times: Sequence[datetime],
    *,
    using: str,
) -> None:
    """In the caller's transaction: the ``OrderedMessage`` rows of ``messages`` sent at
    ``times`` (``send_times``)."""
    label = model._meta.label
    names = key_names(model)
    by = ordered_by(model)
    OrderedMessage.objects.using(using).bulk_create(
        [
            OrderedMessage(
                pk=message_row_id(label, [m.key[n] for n in names]),
                queue=label,
                sequence=sequence_id(label, [m.key[n] for n in by]),
                sent_at=at,
            )
            for m, at in zip(messages, times, strict=True)
        ]
    )


def forget_places(model: type[models.Model], keys: Sequence[Sequence[Any]], *, using: str) -> None:
    """In the caller's transaction: delete the ``OrderedMessage`` rows of the messages under
    ``keys`` (acked, dead-lettered, discarded, deleted): the next of each key may go."""
    label = model._meta.label
    ids = sorted({message_row_id(label, k) for k in keys})
    rows = OrderedMessage.objects.using(using)
    for first in range(0, len(ids), CHUNK):  # (Spanner binds at most 950 parameters)
        rows.filter(pk__in=ids[first : first + CHUNK]).delete()


def heads(
    model: type[models.Model], messages: Sequence[Message], *, using: str
) -> tuple[list[Message], list[Message]]:
    """``messages`` split into the heads of their ordering keys (no earlier message of the key
    exists) and the others, which must wait, each with its ``send_time`` (its place) from its
    ``OrderedMessage`` row; one read. A message without a row (sent before the queue was
    ordered) is a head."""
    label = model._meta.label
    ids = {message_row_id(label, m.key): m for m in messages}
    rows = OrderedMessage.objects.using(using)
    earlier = rows.filter(
        sequence=models.OuterRef("sequence"), sent_at__lt=models.OuterRef("sent_at")
    )
    found = rows.filter(pk__in=sorted(ids)).annotate(waits=models.Exists(earlier))
    places = {
        pk: (sent_at, waits) for pk, sent_at, waits in found.values_list("pk", "sent_at", "waits")
    }
    first: list[Message] = []
    later: list[Message] = []
    for pk, m in ids.items():
        sent_at, waits = places.get(pk, (None, False))
        placed = m if sent_at is None else m.placed(sent_at)
        (later if waits else first).append(placed)
    return first, later


def recorded_places(
    model: type[models.Model], keys: Sequence[Sequence[Any]], *, using: str
) -> dict[tuple[Any, ...], datetime]:
    """The send times (places) the ``OrderedMessage`` rows of the messages under ``keys``
    hold, by key; one read (a message received outside the worker carries none)."""
    label = model._meta.label
    ids = {message_row_id(label, k): tuple(k) for k in keys}
    rows = OrderedMessage.objects.using(using).filter(pk__in=sorted(ids))
    return {ids[pk]: at for pk, at in rows.values_list("pk", "sent_at")}
