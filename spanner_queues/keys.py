"""Message keys: the queue model's primary-key fields, as values and as ORM filters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.db.models import Q

from spanner_queues.message import Message
from spanner_queues.payload import from_stored

if TYPE_CHECKING:
    from django.db import models


def key_fields(model: type[models.Model]) -> tuple[Any, ...]:
    """The concrete fields of the model's primary key, in key order."""
    pk = model._meta.pk
    fields = getattr(pk, "fields", None)
    if fields is not None:  # CompositePrimaryKey
        return tuple(fields)
    return (pk,)


def column_field(model: type[models.Model], name: str) -> models.Field:
    """The concrete field ``name`` of a queue model (its key, payload and bookkeeping columns
    are concrete fields; ``get_field`` is typed to return relations and generic keys too)."""
    return cast("models.Field", model._meta.get_field(name))


def parent_model(model: type[models.Model], field_name: str) -> type[models.Model]:
    """The model a queue is interleaved in: the target of its ``interleave_in_parent``
    ForeignKey, resolved to a class once the app registry is ready."""
    return cast("type[models.Model]", model._meta.get_field(field_name).related_model)


def key_names(model: type[models.Model]) -> tuple[str, ...]:
    return tuple(f.attname for f in key_fields(model))


def key_filter(model: type[models.Model], key: tuple[Any, ...]) -> Q:
    return Q(**dict(zip(key_names(model), key, strict=True)))


def row_to_message(model: type[models.Model], row: Any) -> Message:
    names = key_names(model)
    loaded = vars(row)  # bookkeeping fields are deferred (absent) on native queues
    return Message(
        queue=model._meta.label,
        key=tuple(getattr(row, n) for n in names),
        key_names=names,
        payload=from_stored(row.payload),
        deliver_time=row.deliver_time,
        attempt=loaded["attempts"] if "attempts" in loaded else None,  # native: unknown
        lease_token=loaded.get("lease_token"),
        lease_expires_at=loaded.get("lease_expires_at"),
        send_time=loaded.get("send_time"),
    )
