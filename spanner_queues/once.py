"""Send once per window: ``send(..., unique_for=timedelta)``.

A send with ``unique_for`` claims its message's key for that long in ``SentOnce`` (one row per
queue and key: a digest of the two, and the window's end), in the sender's transaction: if a
window of the key has not ended, the message is not written and the send reports it dropped
(``Message.dropped``; logged at INFO); else the window is set from now and the message is
written. The claim and the message commit or roll back together, so a send rolled back claims
nothing. The window counts from the send that was kept, whatever happened to its message since
(received, acked, deleted): a second send inside it is dropped even after the first was handled.

Two senders of one key at once: each reads no window and writes one; the second to commit
fails (a duplicate key on PostgreSQL and SQLite, an aborted transaction on Spanner), never
sending twice. Rows of ended windows are deleted: by Spanner's row deletion policy a day after
their end, and on other databases by ``prune`` (at most once an hour per process and database,
from a send with ``unique_for``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from spanner_queues import clock
from spanner_queues.drivers import driver_for
from spanner_queues.exceptions import InvalidArgument

__all__ = ["SentOnce"]

logger = logging.getLogger("spanner_queues")

#: the longest window a send may claim
MAX_WINDOW = timedelta(days=365)
#: keys one read of the windows binds (Spanner binds at most 950 parameters a statement)
READ_BATCH = 900
#: seconds between two prunes of one database by one process
PRUNE_EVERY_SECONDS = 3600.0
#: windows ended longer ago than this are pruned (kept a little: a clock step is no reopening)
PRUNE_AFTER = timedelta(hours=1)


class SentOnce(models.Model):
    """The window of one queue's key: no second send of it is written before ``open_until``."""

    id = models.CharField(max_length=64, primary_key=True)
    queue = models.CharField(max_length=200)
    open_until = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name = "send-once window"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.queue} {self.id} until {self.open_until:%Y-%m-%d %H:%M:%S}"


def check_window(window: Any, label: str) -> timedelta:
    """``window`` if it is a timedelta from a microsecond to ``MAX_WINDOW``; else
    ``InvalidArgument`` naming the queue and the limit."""
    if not isinstance(window, timedelta) or not timedelta(0) < window <= MAX_WINDOW:
        raise InvalidArgument(
            f"{label}: unique_for must be a timedelta greater than 0 and at most "
            f"{MAX_WINDOW.days} days, not {window!r}."
        )
    return window


def window_id(label: str, key: dict[str, Any]) -> str:
    """The row of ``label``'s key ``key`` (attribute name -> value): a digest of both."""
    text = json.dumps([label, sorted(key.items())], cls=DjangoJSONEncoder, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def claim(
    label: str, keys: Sequence[dict[str, Any]], windows: Sequence[timedelta], *, using: str
) -> list[bool]:
    """In the caller's transaction: for each key, whether its send goes ahead (no window of
    it open now, nor claimed earlier in ``keys``); each one that does opens its window (its
    row written with ``open_until`` = now + its window). Returns one bool per key."""
    now = clock.now()
    ids = [window_id(label, key) for key in keys]
    manager = SentOnce.objects.using(using)
    open_until: dict[str, Any] = {}
    unique = list(dict.fromkeys(ids))
    for start in range(0, len(unique), READ_BATCH):
        part = unique[start : start + READ_BATCH]
        open_until.update(manager.filter(pk__in=part).values_list("pk", "open_until"))
    go: list[bool] = []
    claimed: set[str] = set()
    for pk, window in zip(ids, windows, strict=True):
        until = open_until.get(pk)
        if pk in claimed or (until is not None and until > now):
            go.append(False)
            continue
        claimed.add(pk)
        if until is None:
            manager.create(id=pk, queue=label, open_until=now + window)
        else:
            manager.filter(pk=pk).update(open_until=now + window)
        go.append(True)
    _prune_if_due(using)
    return go


_next_prune: dict[str, float] = {}
_prune_lock = threading.Lock()


def _prune_if_due(using: str) -> None:
    """``prune``, at most every ``PRUNE_EVERY_SECONDS``, where the database has no row
    deletion policy to do it."""
    if driver_for(using).supports_row_deletion_policy:
        return
    now = time.monotonic()
    with _prune_lock:
        if now < _next_prune.get(using, 0.0):
            return
        _next_prune[using] = now + PRUNE_EVERY_SECONDS
    prune(using=using)


def prune(*, using: str, limit: int = 1000) -> int:
    """Delete up to ``limit`` windows that ended more than ``PRUNE_AFTER`` ago (in the
    caller's transaction, if any: a bounded statement); returns how many went."""
    manager = SentOnce.objects.using(using)
    ended = manager.filter(open_until__lt=clock.now() - PRUNE_AFTER).values_list("pk", flat=True)
    ids = list(ended[:limit])
    if not ids:
        return 0
    deleted: Any = manager.filter(pk__in=ids).delete()
    return int(deleted[0])
