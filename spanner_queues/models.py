"""The ``Queue`` abstract model: declare a queue as a Django model with its own key columns.

    class UserTasks(Queue):
        user_id = models.BigIntegerField()
        message_id = models.CharField(max_length=64)
        pk = models.CompositePrimaryKey("user_id", "message_id")

Every queue inherits ``payload`` and ``deliver_time``. ``payload`` is bytes (``BYTES(MAX)``)
unless ``QueueMeta.payload_type`` says ``"string"`` (a ``TextField``: ``STRING(MAX)``) or
``"json"`` (a ``JSONPayloadField``: JSON text, ``JSON`` on native queues). The table engine
also keeps ``send_time``, ``attempts``, ``lease_token`` and ``lease_expires_at``; they are
read-only bookkeeping. Messages are rows: query them with the ORM. Rows are never updated
through the ORM (Spanner queues have no UPDATE): replace a message with ack + send.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone

from spanner_queues.api import replace, send_many
from spanner_queues.causes import FailureCause  # noqa: F401  (failures by cause)
from spanner_queues.controls import (  # noqa: F401  (operator controls)
    MessageCancellation,
    PausedQueue,
    QueueRate,
)
from spanner_queues.exceptions import MessageUpdateRefused
from spanner_queues.failures import FailedDelivery  # noqa: F401  (failure ledger)
from spanner_queues.keys import row_to_message
from spanner_queues.monitoring import QueueDepthSample  # noqa: F401  (the depth chart's history)
from spanner_queues.ordering import KeySequence, OrderedMessage  # noqa: F401  (ordered per key)
from spanner_queues.payload import BYTES
from spanner_queues.storage import (
    BOOKKEEPING_FIELDS,
    UPDATE_REFUSED,
    JSONPayloadField,
    QueueBase,
    QueueManager,
    QueueQuerySet,
    payload_field,
    stores_bookkeeping,
)
from spanner_queues.uniqueness import SentKey  # noqa: F401  (send once per window)

if TYPE_CHECKING:
    from spanner_queues.message import Message

#: the public names; the models of the other modules are imported so that Django registers
#: them with the app (their own modules are their home)
__all__ = ["JSONPayloadField", "Queue", "QueueManager", "QueueQuerySet", "Queues"]


class Queue(models.Model, metaclass=QueueBase):
    """Abstract base of every queue. Subclass it in an app's ``models.py``."""

    payload = payload_field(BYTES)
    deliver_time = models.DateTimeField(
        db_column="DeliverTime", db_index=True, default=timezone.now
    )
    send_time = models.DateTimeField(default=timezone.now, editable=False)
    attempts = models.PositiveIntegerField(default=0, editable=False)
    lease_token = models.CharField(max_length=64, null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = QueueManager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding or kwargs.get("force_update") or kwargs.get("update_fields"):
            raise MessageUpdateRefused(UPDATE_REFUSED.format(label=type(self).__name__))
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def _do_insert(self, manager: Any, using: Any, fields: Any, *args: Any) -> Any:
        # save() inserts through the plain base manager: skip unstored bookkeeping here too.
        if not stores_bookkeeping(type(self)):
            fields = [f for f in fields if f.name not in BOOKKEEPING_FIELDS]
        # Model._do_insert: the private hook save_base inserts through (not in django-stubs)
        return super()._do_insert(manager, using, fields, *args)  # type: ignore[misc]

    # --- sending -------------------------------------------------------------------------

    @classmethod
    def send(
        cls,
        *,
        payload: Any = b"",
        deliver_time: datetime | None = None,
        delay: timedelta | None = None,
        using: str | None = None,
        unique_for: timedelta | None = None,
        **key: Any,
    ) -> Message:
        """Send one message inside the current transaction of the queue's database.

        The row is written through the caller's connection: it commits or rolls back with the
        caller's other writes. A key that already exists raises ``MessageAlreadyExists``.
        ``unique_for``: send the key at most once per window (``api.send_many``); a dropped
        send returns a ``Message`` with ``dropped=True``.
        """
        return send_many(
            cls,
            [dict(key, payload=payload, deliver_time=deliver_time, delay=delay)],
            using=using,
            unique_for=unique_for,
        )[0]

    @classmethod
    def send_many(
        cls,
        messages: Iterable[Mapping[str, Any]],
        *,
        using: str | None = None,
        unique_for: timedelta | None = None,
    ) -> list[Message]:
        """Send several messages in one statement; each dict holds key fields, ``payload``,
        optionally ``deliver_time`` or ``delay``. ``unique_for``: see ``api.send_many``."""
        return send_many(cls, messages, using=using, unique_for=unique_for)

    @classmethod
    def replace(
        cls,
        *,
        payload: Any = b"",
        deliver_time: datetime | None = None,
        delay: timedelta | None = None,
        using: str | None = None,
        **key: Any,
    ) -> Message:
        """Delete any message under this key and send a new one, in one transaction
        (the heartbeat pattern: queues have no UPDATE)."""
        return replace(
            cls, key, payload=payload, deliver_time=deliver_time, delay=delay, using=using
        )

    def as_message(self) -> Message:
        return row_to_message(type(self), self)


class Queues(models.Model):
    """No table: carries the admin's permissions and its entry on the admin index.

    ``view_queues`` lets staff see the queue pages; each kind of action has its own permission.
    """

    class Meta:
        managed = False
        verbose_name = "queue"
        verbose_name_plural = "queues"
        default_permissions = ("view",)
        permissions = [
            ("ack_message", "Can ack (delete) queue messages"),
            ("reschedule_message", "Can deliver queue messages now or reschedule them"),
            ("dead_letter_message", "Can move messages to and replay them from dead-letter queues"),
            ("pause_queue", "Can pause and resume queues for every worker"),
            ("cancel_message", "Can cancel queue messages"),
        ]

    def __str__(self) -> str:
        return "queues"
