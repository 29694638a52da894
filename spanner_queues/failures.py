"""Failed runs of messages on engines that keep no delivery count (native Spanner queues).

Spanner counts no deliveries, so ``message.attempt``, ``max_attempts`` and dead-letter queues
would mean nothing there. Instead the worker records each failed run, on every queue, in the
transaction that handles the failure (``record_failure``); the native engine reads the counts
of a received batch when the first ``message.attempt`` of it is read, one query for the batch
(``message.attempt`` = failed runs + 1; a receiver that never reads it costs no read), the
worker dead-letters (or discards) the message once its failures reach ``max_attempts``, and
the record is deleted in the transaction that acks the message, retries, dead-letters or
discards it (``clear_failures``).

What it does not count: a delivery whose worker died or whose lease expired mid-run leaves no
record (Spanner redelivers it with back-off, as it always does), nor does a message received
with ``api.receive`` whose lease the caller let lapse. A key sent again while an old record of
it stands (after a failed clear) starts from that record's count.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from spanner_queues import clock

if TYPE_CHECKING:
    from spanner_queues.message import Message

#: how much of a failure's text is kept.
ERROR_LIMIT = 1000


class FailedDelivery(models.Model):
    """How many runs of one message failed, on an engine that keeps no delivery count."""

    queue = models.CharField(max_length=200)
    message_key = models.CharField(max_length=1000)
    failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = "failed delivery"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["queue", "message_key"], name="sq_failed_delivery_key")
        ]

    def __str__(self) -> str:
        return f"{self.queue}{self.message_key}: {self.failures} failed"


def key_text(key: Sequence[Any]) -> str:
    """One stable text per key (bytes as base64; UUIDs, dates and decimals as Django's JSON)."""
    values = [
        base64.b64encode(v).decode() if isinstance(v, (bytes, memoryview)) else v for v in key
    ]
    return json.dumps(values, cls=DjangoJSONEncoder, separators=(",", ":"))


def failures_of(queue: str, keys: Iterable[Sequence[Any]], *, using: str) -> dict[tuple, int]:
    """Recorded failures by key, for the keys that have any."""
    texts = {key_text(k): tuple(k) for k in keys}
    if not texts:
        return {}
    rows = FailedDelivery.objects.using(using).filter(queue=queue, message_key__in=list(texts))
    return {texts[r.message_key]: r.failures for r in rows}


def record_failure(message: Message, error: BaseException | None, *, using: str) -> int:
    """Count one more failed run of ``message`` in the caller's transaction; return the count."""
    text = key_text(message.key)
    manager = FailedDelivery.objects.using(using)
    row = manager.filter(queue=message.queue, message_key=text).first()
    detail = f"{type(error).__name__}: {error}"[:ERROR_LIMIT] if error is not None else ""
    if row is None:
        row = manager.create(
            queue=message.queue,
            message_key=text,
            failures=1,
            last_error=detail,
            updated_at=clock.now(),
        )
    else:
        row.failures += 1
        row.last_error = detail
        row.updated_at = clock.now()
        row.save(using=using, update_fields=["failures", "last_error", "updated_at"])
    return row.failures


def clear_failures(queue: str, keys: Iterable[Sequence[Any]], *, using: str) -> None:
    """Forget the failures of ``keys`` in the caller's transaction."""
    texts = [key_text(k) for k in keys]
    if texts:
        FailedDelivery.objects.using(using).filter(queue=queue, message_key__in=texts).delete()
