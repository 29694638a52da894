"""Send once per window (``send(..., unique_for=timedelta)``): the ledger of sent keys.

A send with ``unique_for`` claims its key in ``SentKey`` in the sender's own transaction (the
one that writes the message; never ``on_commit``): one row per (queue, key), identified by a
digest of both, holding when its window ends (``window_ends_at``). If the key's row has a
window that has not ended, the send is dropped (nothing written; the returned ``Message`` has
``dropped=True``, and an INFO line names the queue and key); else the row's window starts
again and the message is sent. The row outlives the message: a key handled and acked within
its window is still dropped. A rolled-back transaction takes its claim with it.

Two senders of one key at once never both send: the second one's insert of the row waits for
the first's transaction and then fails (``IntegrityError``), or, on a row whose window ended,
its conditional update finds the window renewed and drops the send; Spanner aborts one of the
two transactions (the retry sees the row). A send outside a transaction runs in a transaction
of its own.

Rows whose window ended are dead weight: on Spanner a row deletion policy removes them
(``OLDER_THAN(window_ends_at, INTERVAL 0 DAY)``, within days of their end); ``prune`` deletes
them on every database. As the native engine's failure ledger is pruned: a claim marks its
database's ledger due a prune at most once per ``PRUNE_INTERVAL_SECONDS`` and process, and
the next ``api.receive`` outside a transaction or worker receive of a queue on it, or the claiming
send itself when it ran in a transaction of its own prunes it, in a transaction of its own; a
prune that fails is logged and never fails the caller.

The Pub/Sub inbox's ``SeenEvent`` keeps event ids for a fixed ``DEDUP_WINDOW_DAYS`` in an
optional app; this ledger keeps a window per send in the core app, so it is a table of its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, models, transaction

from spanner_queues import clock
from spanner_queues.exceptions import InvalidArgument

logger = logging.getLogger("spanner_queues.uniqueness")

DROPPED = "%s: send of key %s dropped (unique_for: sent within its window)"
#: rows one prune deletes at most (Spanner binds at most 950 parameters a statement)
PRUNE_BATCH = 900
#: how often (seconds) a process prunes the ledger of a database it claimed keys in
PRUNE_INTERVAL_SECONDS = 3600.0

_prune_lock = threading.Lock()
#: when (monotonic) this process last marked each database's ledger due a prune
_pruned: dict[str, float] = {}
#: databases whose ledger is due a prune
_prune_due: set[str] = set()


class SentKey(models.Model):
    """A key sent with ``unique_for``: a send of it before ``window_ends_at`` is dropped."""

    #: ``sent_key_id(queue, key_text)``: one id column, the same on every database
    id = models.CharField(primary_key=True, max_length=64)
    #: the queue's label
    queue = models.CharField(max_length=200)
    #: when the window of the last send ends
    window_ends_at = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name = "key sent once per window"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.queue}: until {self.window_ends_at:%Y-%m-%d %H:%M:%S}"


class _KeyEncoder(DjangoJSONEncoder):
    def default(self, o: Any) -> Any:
        if isinstance(o, (bytes, bytearray, memoryview)):
            return bytes(o).hex()
        return super().default(o)


def key_text(key: object) -> str:
    """A message key (or any JSON-able value, e.g. a task's path and arguments) as text."""
    return json.dumps(key, cls=_KeyEncoder, separators=(",", ":"), sort_keys=True)


def sent_key_id(queue: str, text: str) -> str:
    """The row id of key ``text`` in the queue labelled ``queue``."""
    return hashlib.sha256(f"{queue}\0{text}".encode()).hexdigest()


def checked_window(unique_for: object) -> timedelta:
    """``unique_for`` if it is a positive ``timedelta``, else ``InvalidArgument``."""
    if not isinstance(unique_for, timedelta) or unique_for <= timedelta(0):
        raise InvalidArgument(
            f"unique_for must be a positive timedelta (longer than 0 seconds), not {unique_for!r}."
        )
    return unique_for


def claim(queue: str, texts: Sequence[str], window: timedelta, *, using: str) -> list[bool]:
    """In the caller's transaction, claim each key text of ``queue`` for ``window``: True for
    a key to send (its row now ends ``window`` from now), False for a key whose window has not
    ended (or that came earlier in ``texts``): its send is dropped."""
    _mark_due(using)
    now = clock.now()
    until = now + window
    ids = [sent_key_id(queue, t) for t in texts]
    rows = SentKey.objects.using(using)
    ends: dict[str, datetime] = dict(
        rows.filter(pk__in=sorted(set(ids))).values_list("pk", "window_ends_at")
    )
    taken: set[str] = set()
    new: list[SentKey] = []
    out: list[bool] = []
    for text, pk in zip(texts, ids, strict=True):
        if pk in taken or (pk in ends and ends[pk] > now):
            logger.info(
                "%s: send of key %s dropped (unique_for: sent within its window)", queue, text
            )
            out.append(False)
            continue
        taken.add(pk)
        if pk not in ends:
            new.append(SentKey(pk=pk, queue=queue, window_ends_at=until))
        elif not rows.filter(pk=pk, window_ends_at__lte=now).update(window_ends_at=until):
            # another sender renewed the window since the read (its transaction committed)
            logger.info(
                "%s: send of key %s dropped (unique_for: sent within its window)", queue, text
            )
            out.append(False)
            continue
        out.append(True)
    if new:
        rows.bulk_create(new)  # a concurrent first send of a key: IntegrityError, never two
    return out


def _mark_due(using: str) -> None:
    last = _pruned.get(using)
    if last is None or time.monotonic() - last > PRUNE_INTERVAL_SECONDS:
        with _prune_lock:
            _pruned[using] = time.monotonic()
            _prune_due.add(using)


def prune_if_due(using: str) -> None:
    """``prune`` the ledger of ``using`` if a claim marked it due and the caller is in no
    transaction, in a transaction of its own; a failure is logged (the next claim an interval
    later marks it due again)."""
    if using not in _prune_due or connections[using].in_atomic_block:
        return
    with _prune_lock:
        if using not in _prune_due:
            return
        _prune_due.discard(using)
    try:
        with transaction.atomic(using=using):
            prune(using=using)
    except Exception:
        logger.warning("pruning the unique_for ledger of %r failed", using, exc_info=True)


def prune(*, using: str, now: datetime | None = None) -> int:
    """Delete up to ``PRUNE_BATCH`` rows whose window has ended; how many were deleted."""
    rows = SentKey.objects.using(using)
    pks = list(
        rows.filter(window_ends_at__lte=now or clock.now())
        .order_by("window_ends_at")
        .values_list("pk", flat=True)[:PRUNE_BATCH]
    )
    if pks:
        rows.filter(pk__in=pks).delete()
    return len(pks)
