"""Failed runs of messages on engines that keep no delivery count (native Spanner queues).

Spanner counts no deliveries, so ``message.attempt``, ``max_attempts`` and dead-letter queues
would mean nothing there. Instead the worker records each failed run, on every queue, in the
transaction that handles the failure (``record_failure``); the native engine reads the counts
of a received batch when the first ``message.attempt`` of it is read, one query for the batch
(``message.attempt`` = failed runs + 1; a receiver that never reads it costs no read), and the
worker dead-letters (or discards) the message once its failures reach ``max_attempts``.

A record belongs to one sent message, not to its key. Whether Spanner keeps the sender's
``DeliverTime`` through leases and redeliveries is not documented (the specification's §7), so
a record keeps what identifies its send under every answer: when the lease of the run that
failed began (``leased_at``, on Spanner's clock: the lease's expiry less the 10 s lease), that
lease's expiry (``lease_expires_at``), the ``DeliverTime`` the delivery showed
(``deliver_time``), and on an envelope queue the event's own ``id``, new per send
(``event_id``). Whether a record is a delivery's (``belongs``):

- an envelope queue's event ``id`` tells, under every answer;
- else, while the queue is taken to keep ``DeliverTime`` (Spanner's answer as far as anyone
  has seen): the record's message has a ``DeliverTime`` no later than ``leased_at`` (a message
  is delivered only once it is due), or equal to the failed run's lease expiry (a Spanner that
  moves it to the lease's expiry but shows the value from before the lease), while a message
  sent under the key after that one was deleted (acked by key, replaced, deleted, by a cascade
  or by TTL, where nothing of ours runs) has a later one: the record is not its, it is read as
  no failure and the next failure starts it again;
- once a delivery of the queue showed a ``DeliverTime`` later than its lease's start (which
  proves that Spanner moves it: the native engine's tripwire, ``moved``), the ``DeliverTime``
  tells nothing: the record is the key's (fail closed: a message sent again under the key of
  one deleted where nothing of ours ran inherits its failures and is given up early, where the
  other guess would retry a failing message for ever).

Records also go with their message where we delete it: the native engine's ``ack_many``
(unless the delivery is known to be a first one, ``first_delivery``, which has no record) and
``delete_any``; ``prune`` deletes the records of messages that are gone, looking only at
records not updated for ``REDELIVERY_BOUND`` (a failing message is delivered again within it),
and never the record of a message under its key that it ``belongs`` to: the ledger stays as
small as the failing messages it describes.

What it does not count: a delivery whose worker died or whose lease expired mid-run leaves no
record (Spanner redelivers it with back-off, as it always does), nor does a message received
with ``api.receive`` whose lease the caller let lapse.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from spanner_queues import clock
from spanner_queues.semantics import LEASE

if TYPE_CHECKING:
    from spanner_queues.message import Message

#: how much of a failure's text is kept.
ERROR_LIMIT = 1000
#: key texts one DELETE of the ledger binds (Spanner binds at most 950 parameters a statement)
CLEAR_BATCH = 900
#: how long after a failed run a failing message is surely delivered again (Spanner retries
#: "with back-off within the first hour, and older messages ... once per hour"), and a lease:
#: the ledger's prune looks only at records not updated for longer.
REDELIVERY_BOUND = timedelta(hours=1) + LEASE
#: the longest event ``id`` a record keeps (a longer one is cut: still distinct in practice)
EVENT_ID_LIMIT = 200


class FailedDelivery(models.Model):
    """How many runs of one sent message failed, on an engine that keeps no delivery count."""

    queue = models.CharField(max_length=200)
    message_key = models.CharField(max_length=1000)
    failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField()
    #: when the lease of the latest failed run began (Spanner's clock); the record is of the
    #: message under ``message_key`` whose ``DeliverTime`` is not later (``belongs``). None (a
    #: message without a lease): any message's. (Records written before it were given their
    #: ``updated_at`` by migration 0005.)
    leased_at = models.DateTimeField(null=True, blank=True)
    #: the expiry of that lease (Spanner's clock); None when not known
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    #: the ``DeliverTime`` the delivery of that run showed; None when not known
    deliver_time = models.DateTimeField(null=True, blank=True)
    #: on an envelope queue, the ``id`` of the failed run's event (new per send); else ""
    event_id = models.CharField(max_length=EVENT_ID_LIMIT, blank=True, default="")

    class Meta:
        verbose_name = "failed delivery"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["queue", "message_key"], name="sq_failed_delivery_key")
        ]

    def __str__(self) -> str:
        return f"{self.queue}{self.message_key}: {self.failures} failed"


class _KeyEncoder(DjangoJSONEncoder):
    """Django's JSON, but a time with sub-millisecond digits keeps all six of them (Django's
    keeps three, so two keys that differ in microseconds would share one text). A time whose
    microseconds are whole milliseconds keeps Django's text: records written before stay
    the records of their keys."""

    def default(self, o: Any) -> Any:
        if isinstance(o, (datetime, time)) and o.microsecond % 1000:
            text = o.isoformat()  # (a time key is naive: Django refuses aware ones)
            return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text
        return super().default(o)


def key_text(key: Sequence[Any]) -> str:
    """One text per key, distinct for distinct keys (bytes as base64; UUIDs, dates and
    decimals as Django's JSON, datetimes to the microsecond). A key whose datetimes have whole
    milliseconds has the text it had before microseconds were kept; a record of a key with
    finer digits written before (shared by the keys equal to the millisecond) is read as no
    key's record, and pruned once no message is under its text's key."""
    values = [
        base64.b64encode(v).decode() if isinstance(v, (bytes, memoryview)) else v for v in key
    ]
    return json.dumps(values, cls=_KeyEncoder, separators=(",", ":"))


def lease_start(message: Message) -> datetime | None:
    """When ``message``'s lease began, on Spanner's clock (its expiry less the 10 s lease; a
    renewed lease: when it was last renewed). None without a lease."""
    expires = message.lease_expires_at
    return expires - LEASE if expires is not None else None


def first_delivery(deliver_time: datetime | None, lease_expires_at: datetime | None) -> bool:
    """Whether a delivery (its message's ``DeliverTime`` and its lease's expiry, as RECEIVE
    gave them) is surely the first of its message, on a queue that keeps ``DeliverTime``: its
    lease began less than one lease after the ``DeliverTime``, so no earlier lease of the
    message can have ended, and no failed run of it is on record. False when it cannot be told
    (the caller asks nothing of a queue whose ``DeliverTime`` moves: ``moved_deliver_time``)."""
    if deliver_time is None or lease_expires_at is None:
        return False
    return lease_expires_at - LEASE < deliver_time + LEASE


def moved_deliver_time(deliver_time: datetime | None, lease_expires_at: datetime | None) -> bool:
    """Whether a delivery proves that Spanner moves ``DeliverTime`` on a lease: it shows a
    ``DeliverTime`` later than its lease's start (a message is delivered only once due, so a
    kept one is never later)."""
    if deliver_time is None or lease_expires_at is None:
        return False
    return deliver_time > lease_expires_at - LEASE


def event_id(message: Message) -> str:
    """The event ``id`` of a message of an envelope queue (new per send); "" elsewhere."""
    event = message.event
    found = event.get("id") if event else None
    return str(found)[:EVENT_ID_LIMIT] if found is not None else ""


@dataclass(frozen=True, slots=True)
class Seen:
    """What a delivery shows of its send: its ``DeliverTime`` and its event ``id`` ("" off an
    envelope queue)."""

    deliver_time: datetime | None
    event_id: str = ""


def belongs(record: FailedDelivery, seen: Seen, *, moved: bool = False) -> bool:
    """Whether ``record`` is of the send a delivery shows (``seen``), on a queue whose
    ``DeliverTime`` is known to move on a lease (``moved``) or taken to be kept (see the
    module's docstring)."""
    if record.event_id and seen.event_id:
        return record.event_id == seen.event_id
    if moved or record.leased_at is None or seen.deliver_time is None:
        return True
    return seen.deliver_time <= record.leased_at or seen.deliver_time == record.lease_expires_at


def failures_of(
    queue: str, seen: Mapping[tuple[Any, ...], Seen], *, using: str, moved: bool = False
) -> dict[tuple, int]:
    """Recorded failures by key, for the deliveries (key -> what each shows of its send) that
    have any: records of earlier messages under the same keys are not theirs (``belongs``)."""
    texts = {key_text(k): tuple(k) for k in seen}
    if not texts:
        return {}
    rows = FailedDelivery.objects.using(using).filter(queue=queue, message_key__in=list(texts))
    found = {}
    for r in rows:
        key = texts[r.message_key]
        if belongs(r, seen[key], moved=moved):
            found[key] = r.failures
    return found


def record_failure(
    message: Message, error: BaseException | None, *, using: str, moved: bool = False
) -> int:
    """Count one more failed run of ``message`` in the caller's transaction; return the count.
    A record of an earlier message under the key is replaced: this message starts at 1. The
    record keeps what identifies this send (its lease, the ``DeliverTime`` shown, the event
    ``id``)."""
    text = key_text(message.key)
    manager = FailedDelivery.objects.using(using)
    row = manager.filter(queue=message.queue, message_key=text).first()
    detail = f"{type(error).__name__}: {error}"[:ERROR_LIMIT] if error is not None else ""
    leased_at = lease_start(message)
    sent_as = event_id(message)
    identity: dict[str, Any] = {
        "lease_expires_at": message.lease_expires_at,
        "deliver_time": message.deliver_time,
        "event_id": sent_as,
    }
    if row is None:
        row = manager.create(
            queue=message.queue,
            message_key=text,
            failures=1,
            last_error=detail,
            updated_at=clock.now(),
            leased_at=leased_at,
            **identity,
        )
    else:
        ours = belongs(row, Seen(message.deliver_time, sent_as), moved=moved)
        row.failures = row.failures + 1 if ours else 1
        row.last_error = detail
        row.updated_at = clock.now()
        # (the latest lease start: still no earlier than this message's DeliverTime)
        if leased_at is not None:
            row.leased_at = (
                leased_at if row.leased_at is None or not ours else max(row.leased_at, leased_at)
            )
        for name, value in identity.items():
            if value or not ours:
                setattr(row, name, value)
        row.save(
            using=using,
            update_fields=["failures", "last_error", "updated_at", "leased_at", *identity],
        )
    return row.failures


def clear_failures(queue: str, keys: Iterable[Sequence[Any]], *, using: str) -> None:
    """Forget the failures of ``keys`` in the caller's transaction (one DELETE per
    ``CLEAR_BATCH`` keys)."""
    texts = [key_text(k) for k in keys]
    manager = FailedDelivery.objects.using(using)
    for start in range(0, len(texts), CLEAR_BATCH):
        manager.filter(queue=queue, message_key__in=texts[start : start + CLEAR_BATCH]).delete()


def stale_records(
    queue: str, *, using: str, before: datetime, limit: int, after: datetime | None = None
) -> list[FailedDelivery]:
    """Up to ``limit`` records of ``queue`` not updated since ``before`` (prune candidates),
    oldest first, those updated after ``after`` only when it is given."""
    found = FailedDelivery.objects.using(using).filter(queue=queue, updated_at__lt=before)
    if after is not None:
        found = found.filter(updated_at__gt=after)
    return list(found.order_by("updated_at")[:limit])


def prune(
    records: Sequence[FailedDelivery],
    deliver_times: Mapping[str, datetime | None],
    *,
    using: str,
    moved: bool = False,
) -> int:
    """Delete the ``records`` whose message is gone: no message under their key now
    (``deliver_times``: key text -> the ``DeliverTime`` of the message under it), or one sent
    after them (``belongs``: never on a queue whose ``DeliverTime`` moves, ``moved``, where
    it cannot be told). Returns how many were deleted."""
    gone = [
        r.pk
        for r in records
        if r.message_key not in deliver_times
        or not belongs(r, Seen(deliver_times[r.message_key]), moved=moved)
    ]
    if gone:
        FailedDelivery.objects.using(using).filter(pk__in=gone).delete()
    return len(gone)
