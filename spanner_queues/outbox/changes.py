"""Outbox change detection: what a save can turn out to be (created or updated) and which
tracked fields an update changes, read inside the caller's transaction."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import connections
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
    # (Field.has_db_default is Django 5.0's; django-stubs 5.2.9 lacks it)
    return all(
        f.has_default() or f.has_db_default()  # type: ignore[attr-defined]
        for f in instance._meta.pk_fields
    )


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
    row = read_tracked(model, instance.pk, tuple(tracked), using)
    if row is None:
        return "created", None  # Django's UPDATE will find no row and INSERT
    return "updated", frozenset(
        field.name
        for attname, field in tracked.items()
        if differs(field, getattr(instance, attname), row[attname])
    )


class _TrackedRead:
    """``SELECT <tracked columns> FROM <table> WHERE <pk> = %s``, compiled once by the ORM
    per model, tracked fields and connection; each read prepares the primary key as the
    ``pk=`` lookup does and converts the columns with the compiler's own converters, so it
    returns what ``filter(pk=...).values(...).first()`` returns without compiling a query."""

    __slots__ = ("_compiler", "converters", "names", "pk_field", "sql")

    def __init__(self, model: type[Model], names: tuple[str, ...], using: str) -> None:
        self.names = names
        self.pk_field = model._meta.pk
        self.sql: str | None = None
        probe = _PROBE.get(self.pk_field.get_internal_type())
        if probe is None:  # e.g. a composite key: the ORM reads it
            return
        query = model._base_manager.db_manager(using).filter(pk=probe).values(*names)[:1].query
        compiler = query.get_compiler(using)
        sql, params = compiler.as_sql()
        selected = [s[0] for s in compiler.select[: compiler.col_count]]
        connection = connections[using]
        if list(params) != [self._prepare(probe, connection)] or [
            getattr(getattr(c, "target", None), "attname", None) for c in selected
        ] != list(names):
            return  # not the plain statement this expects: the ORM reads it
        self.converters = compiler.get_converters(selected)
        self.sql = sql
        self._compiler = compiler

    def _prepare(self, pk: Any, connection: Any) -> Any:
        return self.pk_field.get_db_prep_value(
            self.pk_field.get_prep_value(pk), connection, prepared=True
        )

    def read(self, pk: Any, connection: Any) -> dict[str, Any] | None:
        with connection.cursor() as cursor:
            cursor.execute(self.sql, [self._prepare(pk, connection)])
            row = cursor.fetchone()
        if row is None:
            return None
        if self.converters:
            row = next(iter(self._compiler.apply_converters([row], self.converters)))
        return dict(zip(self.names, row, strict=True))


#: a sample key per key type, to check the compiled statement's one parameter
_PROBE: dict[str, Any] = {
    "AutoField": 1,
    "BigAutoField": 1,
    "SmallAutoField": 1,
    "IntegerField": 1,
    "BigIntegerField": 1,
    "SmallIntegerField": 1,
    "PositiveIntegerField": 1,
    "PositiveBigIntegerField": 1,
    "CharField": "probe",
    "UUIDField": "00000000-0000-0000-0000-000000000001",
}

#: connection -> compiled reads, so converters bound to a connection stay with it
_reads: weakref.WeakKeyDictionary[Any, dict[tuple[type[Model], tuple[str, ...]], _TrackedRead]]
_reads = weakref.WeakKeyDictionary()


def read_tracked(
    model: type[Model], pk: Any, names: tuple[str, ...], using: str
) -> dict[str, Any] | None:
    """The row's values of the fields ``names`` (attnames), or None when there is no row."""
    connection = connections[using]
    per_connection = _reads.get(connection)
    if per_connection is None:
        per_connection = _reads[connection] = {}
    read = per_connection.get((model, names))
    if read is None:
        read = per_connection[(model, names)] = _TrackedRead(model, names, using)
    if read.sql is None:
        return model._base_manager.db_manager(using).filter(pk=pk).values(*names).first()
    return read.read(pk, connection)


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
