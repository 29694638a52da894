"""Failures grouped by cause: what an operator reads as "``TimeoutError: connect to carrier
<ip> after <n> ms`` — 3,112 failures, 40 given up, first at 02:10, last at 02:41".

A cause is a queue, an error class and a *fingerprint* of the error's text: numbers, UUIDs,
long hex strings, IP addresses (with their port), e-mail addresses and URLs' parts after the
host folded to placeholders (``fingerprint``), so that one fault hit by many messages is one
row, whatever ids and addresses its text carries. ``FailureCause`` counts each cause's failed
runs and the messages given up because of it (dead-lettered or discarded at
``max_attempts``), with the first and last time and the first failure's text as a sample.

The worker (and ``testing.drain()``, which settles as it does) notes each failed run after the
failure ledger's transaction, in a short transaction of its own (``note``), on every engine: a
cause is observability, never part of a delivery's correctness, so a note that fails is logged
and dropped, and never changes what happens to the message. Bounded: at most
``MAX_CAUSES_PER_QUEUE`` causes a queue (past it, new ones count under one ``<other>`` cause of
their class), and causes not seen for ``KEEP_DAYS`` days are pruned (``prune``; at most once an
hour per process and database, from ``note``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, models
from django.db.models import F

from spanner_queues import clock
from spanner_queues.transactions import run_in_transaction

__all__ = ["FailureCause", "causes_of", "fingerprint"]

logger = logging.getLogger("spanner_queues.worker")

#: the longest fingerprint kept (the folded text, cut)
FINGERPRINT_LIMIT = 300
#: the longest sample (the first failure's text) kept
SAMPLE_LIMIT = 1000
#: most causes one queue keeps; past it a new cause counts under its class's ``<other>``
MAX_CAUSES_PER_QUEUE = 200
#: causes not seen for this many days are pruned
KEEP_DAYS = 7
#: seconds between two prunes of one database by one process
PRUNE_EVERY_SECONDS = 3600.0
#: the fingerprint of the causes counted together past ``MAX_CAUSES_PER_QUEUE``
OTHER = "<other>"

#: (pattern, placeholder), applied in order: the more specific first
_FOLDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^/\s:?#]+)(?::\d+)?[^\s'\"]*", re.I), r"\1/<path>"),
    (
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
        "<uuid>",
    ),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"), "<ip>"),
    (  # IPv6: bracketed (with a port), or with "::" or all eight groups
        re.compile(
            r"\[[0-9a-f:.]+\](?::\d+)?"
            r"|(?<![\w:])(?=[0-9a-f:]*::|(?:[0-9a-f]{1,4}:){7})[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7}"
            r"(?![\w:])",
            re.I,
        ),
        "<ip>",
    ),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<hex>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{12,}\b", re.I), "<hex>"),
    (re.compile(r"(?<![A-Za-z0-9<])[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?", re.I), "<n>"),
    (re.compile(r"\s+"), " "),
)


def fingerprint(text: str) -> str:
    """``text`` with what differs from one message to the next folded to placeholders
    (``<n>``, ``<uuid>``, ``<hex>``, ``<ip>``, ``<email>``, a URL's ``<path>``), cut to
    ``FINGERPRINT_LIMIT`` characters."""
    for pattern, placeholder in _FOLDS:
        text = pattern.sub(placeholder, text)
    return text.strip()[:FINGERPRINT_LIMIT]


def error_class(error: BaseException) -> str:
    """The error's class as ``module.QualName`` (``builtins.`` left out)."""
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def cause_id(queue: str, error_class: str, fingerprint: str) -> str:
    """The cause's primary key: a digest of the three (the same on every engine and process)."""
    digest = hashlib.sha256(f"{queue}\0{error_class}\0{fingerprint}".encode())
    return digest.hexdigest()[:32]


class FailureCause(models.Model):
    """One cause of failed runs of one queue (see the module)."""

    id = models.CharField(max_length=32, primary_key=True)
    queue = models.CharField(max_length=200, db_index=True)
    error_class = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=FINGERPRINT_LIMIT)
    #: the text of the first failure of this cause (``SAMPLE_LIMIT`` characters)
    sample = models.TextField(blank=True, default="")
    #: failed runs
    failures = models.PositiveIntegerField(default=0)
    #: messages given up at ``max_attempts`` (dead-lettered or discarded) after a run of it
    given_up = models.PositiveIntegerField(default=0)
    first_at = models.DateTimeField()
    last_at = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name = "failure cause"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.queue}: {self.title}"

    @property
    def title(self) -> str:
        """``"TimeoutError: connect to carrier <ip>"``."""
        name = self.error_class.rsplit(".", 1)[-1]
        return f"{name}: {self.fingerprint}" if self.fingerprint else name


def note(
    queue: str, error: BaseException | None, *, using: str, failed: int = 1, given_up: int = 0
) -> None:
    """Count ``failed`` runs and ``given_up`` messages of ``queue`` under ``error``'s cause,
    in a transaction of its own; a failure to do so is logged (WARNING), never raised. Nothing
    for a run that failed without an error (a lost lease, a time limit has its own)."""
    if error is None:
        return
    try:
        for attempt in range(2):  # a cause another process created meanwhile: update it
            try:
                run_in_transaction(
                    lambda: _count(queue, error, using, failed, given_up),
                    using=using,
                    retries=3,
                )
                break
            except IntegrityError:
                if attempt:
                    raise
        _prune_if_due(using)
    except Exception:
        logger.warning("%s: counting a failure's cause failed", queue, exc_info=True)


def _count(queue: str, error: BaseException, using: str, failed: int, given_up: int) -> None:
    cls = error_class(error)
    text = str(error)
    folded = fingerprint(text)
    pk = cause_id(queue, cls, folded)
    manager = FailureCause.objects.using(using)
    now = clock.now()
    counted = manager.filter(pk=pk).update(
        failures=F("failures") + failed, given_up=F("given_up") + given_up, last_at=now
    )
    if counted:
        return
    if manager.filter(queue=queue).count() >= MAX_CAUSES_PER_QUEUE:
        folded, text = OTHER, ""
        pk = cause_id(queue, cls, folded)
        if manager.filter(pk=pk).update(
            failures=F("failures") + failed, given_up=F("given_up") + given_up, last_at=now
        ):
            return
    manager.create(
        id=pk,
        queue=queue,
        error_class=cls[:200],
        fingerprint=folded,
        sample=f"{type(error).__name__}: {text}"[:SAMPLE_LIMIT] if text else "",
        failures=failed,
        given_up=given_up,
        first_at=now,
        last_at=now,
    )


def causes_of(queue: str, *, using: str, limit: int = 20) -> list[FailureCause]:
    """``queue``'s causes, the most recently seen first."""
    found = FailureCause.objects.using(using).filter(queue=queue)
    return list(found.order_by("-last_at")[:limit])


#: when this process last pruned each database's causes
_prunes = clock.Throttle()


def _prune_if_due(using: str) -> None:
    if _prunes.due(using, PRUNE_EVERY_SECONDS):
        prune(using=using)


def prune(*, using: str, days: int = KEEP_DAYS) -> int:
    """Delete the causes not seen for ``days`` days; returns how many went."""
    cutoff = clock.now() - timedelta(days=days)
    deleted: Any = FailureCause.objects.using(using).filter(last_at__lt=cutoff).delete()
    return int(deleted[0])
