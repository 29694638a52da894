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
from django.db.models.base import ModelBase
from django.utils import timezone

from spanner_queues.exceptions import MessageUpdateRefused
from spanner_queues.failures import FailedDelivery  # noqa: F401  (failure ledger)
from spanner_queues.monitoring import QueueDepthSample, Queues  # noqa: F401  (admin models)
from spanner_queues.payload import BYTES, JSON, STRING, json_value_text

if TYPE_CHECKING:
    from spanner_queues.message import Message

_UPDATE_REFUSED = (
    "Queue messages cannot be updated (Spanner queues have no UPDATE). "
    "Replace a message with ack + send, e.g. {label}.replace(...)."
)


#: table-engine bookkeeping; engines whose features say ``stores_bookkeeping_fields=False``
#: (native queues) have no such columns, so the ORM neither selects nor inserts them.
BOOKKEEPING_FIELDS = ("send_time", "attempts", "lease_token", "lease_expires_at")


def stores_bookkeeping(model: type[models.Model]) -> bool:
    """Whether the engine of queue ``model`` keeps the bookkeeping columns."""
    try:
        from spanner_queues.registry import engine_for

        return engine_for(model).features.stores_bookkeeping_fields  # type: ignore[arg-type]
    except Exception:  # not configured yet, historical migration model...: the default
        return True


class QueueQuerySet(models.QuerySet):
    """A QuerySet that refuses UPDATE; delete (cancel or ack without assert) is allowed."""

    def __init__(self, model: Any = None, query: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, query, *args, **kwargs)
        if query is None and model is not None and not stores_bookkeeping(model):
            self.query.add_deferred_loading(BOOKKEEPING_FIELDS)

    def _insert(self, objs: Any, fields: Any, *args: Any, **kwargs: Any) -> Any:
        if not stores_bookkeeping(self.model):
            fields = [f for f in fields if f.name not in BOOKKEEPING_FIELDS]
        return super()._insert(objs, fields, *args, **kwargs)

    _insert.queryset_only = False  # type: ignore[attr-defined]

    def update(self, **kwargs: Any) -> int:
        raise MessageUpdateRefused(_UPDATE_REFUSED.format(label=self.model.__name__))

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise MessageUpdateRefused(_UPDATE_REFUSED.format(label=self.model.__name__))

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise MessageUpdateRefused(_UPDATE_REFUSED.format(label=self.model.__name__))

    def _update_bookkeeping(self, **kwargs: Any) -> int:
        """Engine-only: update lease bookkeeping columns. Not part of the public API."""
        return super().update(**kwargs)


def rows(model: type[models.Model], using: str) -> QueueQuerySet:
    """All rows of a queue on ``using``, ignoring custom default managers (engine use)."""
    return QueueQuerySet(model=model, using=using)


class QueueManager(models.Manager.from_queryset(QueueQuerySet)):  # type: ignore[misc]
    """The manager of every queue. Kept in migrations, which is how migration state tells
    queue models apart (``CreateQueue``/``DeleteQueue``)."""

    use_in_migrations = True

    def __eq__(self, other: object) -> bool:
        # Unlike Manager.__eq__, never equal to a plain Manager: migrations must keep it.
        return type(other) is type(self) and super().__eq__(other)

    def __hash__(self) -> int:
        return id(self)


class JSONPayloadField(models.TextField):
    """The ``payload`` of a ``payload_type = "json"`` queue: canonical JSON text (keys
    sorted, no spaces) in a text column, or Spanner's ``JSON`` column on native queues. Reads
    give that text (a ``str``) whatever the database returns for the column."""

    queue_payload_type = JSON
    description = "JSON text (a queue payload)"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return json_value_text(value).decode("utf-8")  # e.g. Spanner's JsonObject


def payload_field(payload_type: str) -> models.Field:
    """A new ``payload`` field for ``payload_type`` ("bytes", "string" or "json")."""
    if payload_type == STRING:
        return models.TextField(db_column="Payload", default="")
    if payload_type == JSON:
        return JSONPayloadField(db_column="Payload")
    return models.BinaryField(db_column="Payload", default=bytes)


class QueueBase(ModelBase):
    """Gives a queue declaring ``QueueMeta.payload_type`` the matching ``payload`` field
    (unless it declares the field itself; check E012 then compares the two)."""

    def __new__(
        mcs, name: str, bases: tuple[type, ...], attrs: dict[str, Any], **kwargs: Any
    ) -> QueueBase:
        meta = attrs.get("QueueMeta") or next(
            (b.QueueMeta for b in bases if hasattr(b, "QueueMeta")), None
        )
        declared = getattr(meta, "payload_type", BYTES)
        if declared in (STRING, JSON) and "payload" not in attrs:
            attrs["payload"] = payload_field(declared)
        return super().__new__(mcs, name, bases, attrs, **kwargs)


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
            raise MessageUpdateRefused(_UPDATE_REFUSED.format(label=type(self).__name__))
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def _do_insert(self, manager: Any, using: Any, fields: Any, *args: Any) -> Any:
        # save() inserts through the plain base manager: skip unstored bookkeeping here too.
        if not stores_bookkeeping(type(self)):
            fields = [f for f in fields if f.name not in BOOKKEEPING_FIELDS]
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
        **key: Any,
    ) -> Message:
        """Send one message inside the current transaction of the queue's database.

        The row is written through the caller's connection: it commits or rolls back with the
        caller's other writes. A key that already exists raises ``MessageAlreadyExists``.
        """
        from spanner_queues.api import send_many

        return send_many(
            cls,
            [dict(key, payload=payload, deliver_time=deliver_time, delay=delay)],
            using=using,
        )[0]

    @classmethod
    def send_many(
        cls, messages: Iterable[Mapping[str, Any]], *, using: str | None = None
    ) -> list[Message]:
        """Send several messages in one statement; each dict holds key fields, ``payload``,
        optionally ``deliver_time`` or ``delay``."""
        from spanner_queues.api import send_many

        return send_many(cls, messages, using=using)

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
        from spanner_queues.api import replace

        return replace(
            cls, key, payload=payload, deliver_time=deliver_time, delay=delay, using=using
        )

    def as_message(self) -> Message:
        from spanner_queues.api import row_to_message

        return row_to_message(type(self), self)


# The task queue and results of spanner_queues.tasks (they subclass Queue, so they come last).
from spanner_queues.tasks.models import TaskMessage, TaskResultRecord  # noqa: E402, F401
