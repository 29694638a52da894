"""How queue messages are stored as rows: the queryset that refuses UPDATE and its manager
(``QueueManager``, which migrations keep), the table engine's bookkeeping fields, the
``payload`` fields and the ``QueueBase`` metaclass that picks one.

This module sits below the engines and the verbs: engines read and write rows through
``rows()``; ``spanner_queues.models.Queue`` (the declaration users subclass) builds on it.
It imports only the engine handler (to ask whether an engine stores the bookkeeping columns),
options, payload and exceptions. Public names stay importable from ``spanner_queues.models``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard, cast

from django.db import models
from django.db.models import sql
from django.db.models.base import ModelBase

from spanner_queues.engines import engine_for
from spanner_queues.envelope import RELAYED, check_envelope, declare
from spanner_queues.exceptions import MessageUpdateRefused
from spanner_queues.payload import BYTES, JSON, STRING, json_value_text

if TYPE_CHECKING:
    from django.db.models.options import Options

    from spanner_queues.models import Queue

UPDATE_REFUSED = (
    "Queue messages cannot be updated (Spanner queues have no UPDATE). "
    "Replace a message with ack + send, e.g. {label}.replace(...)."
)

#: table-engine bookkeeping; engines whose features say ``stores_bookkeeping_fields=False``
#: (native queues) have no such columns, so the ORM neither selects nor inserts them.
BOOKKEEPING_FIELDS = ("send_time", "attempts", "lease_token", "lease_expires_at")


def stores_bookkeeping(model: type[models.Model]) -> bool:
    """Whether the engine of queue ``model`` keeps the bookkeeping columns."""
    try:
        return engine_for(model).features.stores_bookkeeping_fields
    except Exception:  # not configured yet, historical migration model...: the default
        return True


class QueueQuerySet(models.QuerySet):
    """A QuerySet that refuses UPDATE; delete (cancel or ack without assert) is allowed. Made
    by the queue's manager and ``rows``, which defer the bookkeeping columns where the engine
    keeps none."""

    def _insert(self, objs: Any, fields: Any, *args: Any, **kwargs: Any) -> Any:
        if not stores_bookkeeping(self.model):
            fields = [f for f in fields if f.name not in BOOKKEEPING_FIELDS]
        # QuerySet._insert: the private hook save and bulk_create insert through (not in stubs)
        return super()._insert(objs, fields, *args, **kwargs)  # type: ignore[misc]

    # so the manager copies it, as Django marks its own; mypy knows no attributes on functions
    _insert.queryset_only = False  # type: ignore[attr-defined]

    def update(self, **kwargs: Any) -> int:
        raise MessageUpdateRefused(UPDATE_REFUSED.format(label=self.model.__name__))

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise MessageUpdateRefused(UPDATE_REFUSED.format(label=self.model.__name__))

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise MessageUpdateRefused(UPDATE_REFUSED.format(label=self.model.__name__))

    def _update_bookkeeping(self, **kwargs: Any) -> int:
        """Engine-only: update lease bookkeeping columns. Not part of the public API."""
        return super().update(**kwargs)


# (a module-level name: the django-stubs plugin types a manager built by from_queryset there)
_QueueManagerBase = models.Manager.from_queryset(QueueQuerySet)


class QueueManager(_QueueManagerBase):
    """The manager of every queue. Kept in migrations, which is how migration state tells
    queue models apart (``CreateQueue``/``DeleteQueue``)."""

    use_in_migrations = True

    def get_queryset(self) -> QueueQuerySet:
        """The queue's rows; the bookkeeping columns deferred where its engine keeps none."""
        queryset = cast("QueueQuerySet", super().get_queryset())
        if not stores_bookkeeping(self.model):
            queryset.query.add_deferred_loading(BOOKKEEPING_FIELDS)
        return queryset

    def __eq__(self, other: object) -> bool:
        # Unlike Manager.__eq__, never equal to a plain Manager: migrations must keep it.
        return type(other) is type(self) and super().__eq__(other)

    def __hash__(self) -> int:
        return id(self)


def rows(model: type[models.Model], using: str) -> QueueQuerySet:
    """All rows of a queue on ``using``, ignoring custom default managers (engine use); the
    bookkeeping columns deferred where the queue's engine keeps none."""
    return rows_with(model, using, bookkeeping=stores_bookkeeping(model))


def rows_with(model: type[models.Model], using: str, *, bookkeeping: bool) -> QueueQuerySet:
    """``rows`` from an engine that knows whether it keeps the bookkeeping columns (the table
    engine: always), without looking the queue's engine up."""
    query = sql.Query(model)
    if not bookkeeping:
        query.add_deferred_loading(BOOKKEEPING_FIELDS)
    return QueueQuerySet(model=model, query=query, using=using)


class JSONPayloadField(models.TextField):
    """The ``payload`` of a ``payload_type = "json"`` queue: canonical JSON text (keys
    sorted, no spaces) in a text column, or Spanner's ``JSON`` column on native queues. Reads
    give that text (a ``str``) whatever the database returns for the column."""

    queue_payload_type = JSON
    description = "JSON text (a queue payload)"

    def deconstruct(self) -> Any:
        # Migrations name it by its public path (as Django shortens ``django.db.models``).
        name, _path, args, kwargs = super().deconstruct()
        return name, "spanner_queues.models.JSONPayloadField", args, kwargs

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
    """The metaclass of every queue. Gives a queue declaring ``QueueMeta.payload_type`` the
    matching ``payload`` field (unless it declares the field itself; check E012 then compares
    the two), and records a ``QueueMeta.envelope`` (``spanner_queues.envelope``; a relayed queue
    without one stores its messages as events too: each send its own event id)."""

    _meta: Options[Any]  # what every class this builds has (ModelBase's stub leaves it out)

    def __new__(
        mcs, name: str, bases: tuple[type, ...], attrs: dict[str, Any], **kwargs: Any
    ) -> QueueBase:
        meta = attrs.get("QueueMeta") or next(
            (b.QueueMeta for b in bases if hasattr(b, "QueueMeta")), None
        )
        declared = getattr(meta, "payload_type", BYTES)
        if declared in (STRING, JSON) and "payload" not in attrs:
            attrs["payload"] = payload_field(declared)
        # (checked before the class is made: a refused queue is never in the app registry)
        envelope = check_envelope(name, getattr(meta, "envelope", None))
        if envelope is None and getattr(meta, "pubsub_topic", None):
            envelope = RELAYED  # each send its own event id (spanner_queues.envelope)
        cls = super().__new__(mcs, name, bases, attrs, **kwargs)
        if envelope is not None and not cls._meta.abstract:  # (historical models declare none)
            declare(cls._meta.label, envelope)
        return cls


def is_queue(model: object) -> TypeGuard[type[Queue]]:
    """Whether ``model`` is a concrete queue (a non-abstract ``Queue`` subclass)."""
    return isinstance(model, QueueBase) and not model._meta.abstract
