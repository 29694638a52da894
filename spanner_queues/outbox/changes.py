"""Outbox change detection: what a save can turn out to be (created or updated) and which
tracked fields an update changes, read inside the caller's transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db.models import Field, Model

if TYPE_CHECKING:
    from spanner_queues.outbox.registration import Registration


def possible_events(instance: Model, update_fields: frozenset[str] | None) -> tuple[str, ...]:
    """What Django's save can turn out to be, decided before any query."""
    if update_fields is not None:
        return ("updated",)  # Django raises if an update_fields save finds no row
    if instance._state.adding and (instance.pk is None or pk_has_default(instance)):
        return ("created",)  # Django forces the INSERT
    return ("created", "updated")


def pk_has_default(instance: Model) -> bool:
    return all(f.has_default() or f.has_db_default() for f in instance._meta.pk_fields)


def classify(
    regs: list[Registration],
    instance: Model,
    possible: tuple[str, ...],
    using: str,
    update_fields: frozenset[str] | None,
) -> tuple[str, frozenset[str] | None]:
    """The expected event and, for an update, the names of the fields it changes.

    Updates compare the instance with its row, read by primary key inside the caller's
    transaction (one SELECT of the tracked fields): the truth at write time, even for an
    instance loaded long ago. ``None`` means "unknown; counts as changed".
    """
    if possible == ("created",):
        return "created", None
    if instance._state.adding:
        return "created", None  # an explicit key: Django tries UPDATE first; post_save knows
    tracked: dict[str, Field] = {}
    for registration in regs:
        if "updated" in registration.on:
            for field in registration.fields:
                if (
                    update_fields is None
                    or field.name in update_fields
                    or (field.attname in update_fields)
                ):
                    tracked[field.attname] = field
    if not tracked:
        return "updated", frozenset()
    model = instance._meta.concrete_model or type(instance)
    row = model._base_manager.db_manager(using).filter(pk=instance.pk).values(*tracked).first()
    if row is None:
        return "created", None  # Django's UPDATE will find no row and INSERT
    return "updated", frozenset(
        field.name
        for attname, field in tracked.items()
        if differs(field, getattr(instance, attname), row[attname])
    )


def restrict(
    changed: frozenset[str] | None, update_fields: frozenset[str] | None, reg: Registration
) -> frozenset[str] | None:
    """Before the read: the fields a save may change, as far as ``update_fields`` tells."""
    if changed is not None:
        return changed
    if update_fields is None:
        return None
    return frozenset(
        f.name for f in reg.fields if f.name in update_fields or f.attname in update_fields
    )


def differs(field: Field, new: Any, old: Any) -> bool:
    if new is old:
        return False
    try:
        return bool(field.to_python(new) != field.to_python(old))
    except (ValidationError, TypeError, ValueError):
        return bool(new != old)
