"""The table engine's SQL: the hand-compiled per-message statements of the hot path, the claim
window, and the stats aggregate.

Written once per queue and database alias (``row_statements``, for every thread); what they
save over the equivalent querysets is measured by ``benchmarks/hand_sql_vs_orm.py``
(docs/benchmarks.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from django.db import connections
from django.db.models import BinaryField, Count, DateTimeField, Max, Min, Q, QuerySet

from spanner_queues import clock
from spanner_queues.engines.base import QueueStats
from spanner_queues.keys import column_field, key_fields, key_filter, key_names
from spanner_queues.message import Message, OutgoingMessage
from spanner_queues.payload import BYTES, payload_type, stored_text

if TYPE_CHECKING:
    from spanner_queues.models import Queue


class Claim(NamedTuple):
    """One row of a claim: its key and the deliver time read (compared and set), and what to
    set."""

    key: tuple[Any, ...]
    was_due: datetime
    lease_token: str
    lease_expires_at: datetime
    attempts: int
    deliver_time: datetime

    def changes(self) -> dict[str, Any]:
        """What ``RowStatements.claim`` sets, as its keyword arguments."""
        return {
            "lease_token": self.lease_token,
            "lease_expires_at": self.lease_expires_at,
            "attempts": self.attempts,
            "deliver_time": self.deliver_time,
        }


class RowStatements:
    """The two per-message statements of the hot path, written once per queue and database
    in the backend's own quoting, with parameters prepared by the fields as the ORM prepares
    them (``get_db_prep_save`` for SET, ``get_prep_value``/``get_db_prep_value`` for ``=``):
    the same SQL as ``filter(<key>, deliver_time=...).update(...)`` and
    ``filter(<key>)._raw_delete()``, without rebuilding and compiling a query per message."""

    __slots__ = (
        "any_due_sql",
        "claim_sql",
        "delete_leased_sql",
        "delete_sql",
        "due_columns",
        "due_sql",
        "fields",
        "key",
        "token_sql",
        "using",
    )

    #: what ``select_due`` reads after the key columns, in this order
    DUE_COLUMNS = ("payload", "deliver_time", "send_time", "attempts", "lease_expires_at")

    def __init__(self, model: type[Queue], using: str) -> None:
        quote = connections[using].ops.quote_name
        meta = model._meta
        self.using = using
        self.key = key_fields(model)
        self.fields = {
            name: column_field(model, name)
            for name in ("lease_token", "lease_expires_at", "attempts", "deliver_time")
        }
        table = quote(meta.db_table)
        where = " AND ".join(f"{quote(f.column)} = %s" for f in self.key)
        sets = ", ".join(f"{quote(f.column)} = %s" for f in self.fields.values())
        deliver = quote(self.fields["deliver_time"].column)
        self.claim_sql = f"UPDATE {table} SET {sets} WHERE {where} AND {deliver} = %s"
        self.delete_sql = f"DELETE FROM {table} WHERE {where}"
        token = quote(self.fields["lease_token"].column)
        self.delete_leased_sql = f"{self.delete_sql} AND {token} = %s"
        self.token_sql = f"SELECT {token} FROM {table} WHERE {where}"
        self.due_columns = (*self.key, *(column_field(model, n) for n in self.DUE_COLUMNS))
        columns = ", ".join(quote(f.column) for f in self.due_columns)
        # = filter(deliver_time__lte=now).order_by("deliver_time").values_list(...)[:limit]
        self.due_sql = f"SELECT {columns} FROM {table} WHERE {deliver} <= %s ORDER BY {deliver} ASC"
        self.any_due_sql = f"SELECT 1 FROM {table} WHERE {deliver} <= %s"

    @staticmethod
    def _lookup(field: Any, value: Any, connection: Any) -> Any:
        return field.get_db_prep_value(field.get_prep_value(value), connection, prepared=True)

    def _key(self, key: Sequence[Any], connection: Any) -> list[Any]:
        return [self._lookup(f, v, connection) for f, v in zip(self.key, key, strict=True)]

    def claim(
        self,
        key: Sequence[Any],
        was_due: datetime,
        *,
        lease_token: str,
        lease_expires_at: datetime,
        attempts: int,
        deliver_time: datetime,
    ) -> int:
        f = self.fields
        connection = connections[self.using]  # this thread's
        params = [
            f["lease_token"].get_db_prep_save(lease_token, connection),
            f["lease_expires_at"].get_db_prep_save(lease_expires_at, connection),
            f["attempts"].get_db_prep_save(attempts, connection),
            f["deliver_time"].get_db_prep_save(deliver_time, connection),
            *self._key(key, connection),
            self._lookup(f["deliver_time"], was_due, connection),
        ]
        with connection.cursor() as cursor:
            cursor.execute(self.claim_sql, params)
            return cursor.rowcount

    def any_due(self, now: datetime) -> bool:
        """Whether a row is due at ``now``: ``filter(deliver_time__lte=now).exists()``."""
        connection = connections[self.using]
        sql = f"{self.any_due_sql} {connection.ops.limit_offset_sql(0, 1)}"
        params = [self._lookup(self.fields["deliver_time"], now, connection)]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone() is not None

    def select_due(
        self, now: datetime, limit: int, *, skip_locked: bool = False
    ) -> list[tuple[Any, ...]]:
        """The first ``limit`` rows due at ``now`` in deliver-time order, as the ORM's
        ``values_list`` of the key columns then ``DUE_COLUMNS`` returns them (the backend's and
        the fields' converters applied); with ``skip_locked``, read with ``FOR UPDATE SKIP
        LOCKED``. The same SQL as the queryset, without building and compiling it per claim."""
        connection = connections[self.using]  # this thread's
        ops = connection.ops
        sql = f"{self.due_sql} {ops.limit_offset_sql(0, limit)}"
        if skip_locked:
            sql += " " + ops.for_update_sql(skip_locked=True)
        params = [self._lookup(self.fields["deliver_time"], now, connection)]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            found = cursor.fetchall()
        if not found:
            return []
        converters = []
        for i, f in enumerate(self.due_columns):
            col = f.get_col(f.model._meta.db_table)
            funcs = ops.get_db_converters(col) + col.get_db_converters(connection)
            if funcs:
                converters.append((i, col, funcs))
        if not converters:
            return [tuple(row) for row in found]
        rows = []
        for row in found:
            values = list(row)
            for i, col, funcs in converters:
                value = values[i]
                for func in funcs:
                    value = func(value, col, connection)
                values[i] = value
            rows.append(tuple(values))
        return rows

    def claim_many(self, claims: Sequence[Claim]) -> list[bool]:
        """``claim`` for each of ``claims`` in one ``executemany`` (the statement converted and
        sent once for the whole claim instead of once per row); which rows it updated, each by
        its own compare-and-set. Where the summed row count falls short (another claimer won
        a row, or a driver that does not sum counts) each row's token is read back: a row is
        claimed when it holds the new token (each one random)."""
        if not claims:
            return []
        f = self.fields
        connection = connections[self.using]  # this thread's
        token_f, expires_f, attempts_f, deliver_f = (
            f["lease_token"],
            f["lease_expires_at"],
            f["attempts"],
            f["deliver_time"],
        )
        save_expires: Callable[[datetime], Any]
        save_deliver: Callable[[datetime], Any]
        look_due: Callable[[datetime], Any]
        if type(expires_f) is DateTimeField and type(deliver_f) is DateTimeField:
            # Plain DateTimeFields: get_db_prep_save (SET) and the prepared lookup (WHERE) of
            # a datetime both come to the backend's adapter (as in InsertStatement).
            adapt = connection.ops.adapt_datetimefield_value
            save_expires = save_deliver = look_due = adapt
        else:

            def save_expires(value: datetime) -> Any:
                return expires_f.get_db_prep_save(value, connection)

            def save_deliver(value: datetime) -> Any:
                return deliver_f.get_db_prep_save(value, connection)

            def look_due(value: datetime) -> Any:
                return self._lookup(deliver_f, value, connection)

        # Each time is adapted once per claim: one lease expiry and one new deliver time per
        # attempt number for all its rows, and often the same deliver time read (a send_many).
        adapted: dict[tuple[Any, datetime], Any] = {}

        def once(adapter: Any, value: datetime) -> Any:
            key = (adapter, value)
            if key not in adapted:
                adapted[key] = adapter(value)
            return adapted[key]

        params = [
            [
                token_f.get_db_prep_save(c.lease_token, connection),
                once(save_expires, c.lease_expires_at),
                attempts_f.get_db_prep_save(c.attempts, connection),
                once(save_deliver, c.deliver_time),
                *self._key(c.key, connection),
                once(look_due, c.was_due),
            ]
            for c in claims
        ]
        with connection.cursor() as cursor:
            cursor.executemany(self.claim_sql, params)
            updated = cursor.rowcount
        if updated == len(claims):
            return [True] * len(claims)
        return [self.held_by(c.key) == [c.lease_token] for c in claims]

    def held_by(self, key: Sequence[Any]) -> list[str | None]:
        """The lease token of the row under ``key`` (``[]``: no row), as a fetch."""
        connection = connections[self.using]
        with connection.cursor() as cursor:
            cursor.execute(self.token_sql, self._key(key, connection))
            return [row[0] for row in cursor.fetchall()]

    def delete(self, key: Sequence[Any], lease_token: str | None = None) -> int:
        """Delete by key; with ``lease_token``, only while the row still holds that token."""
        connection = connections[self.using]
        params = self._key(key, connection)
        sql = self.delete_sql
        if lease_token is not None:
            sql = self.delete_leased_sql
            params.append(self.fields["lease_token"].get_db_prep_value(lease_token, connection))
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount


#: per (queue model, alias): the SQL is the same for every thread's connection
_cache: dict[tuple[type[Queue], str], RowStatements] = {}


class InsertStatement:
    """One message's INSERT as ``bulk_create`` writes it (every concrete column, in model
    order), written once per queue and database, without building a model instance: the key,
    payload and time parameters are prepared per message by their fields as the ORM prepares
    them (``get_db_prep_save``), the constant ones (``attempts`` 0, no lease) once. ``sql`` is
    None where the ORM must write the row: a column filled by the database (auto-increment
    key, ``db_default``), a custom placeholder, or a column this statement does not know."""

    __slots__ = (
        "key_names", "label", "plain_times", "plan", "sql", "template", "text", "using", "varying",
    )  # fmt: skip

    _CONSTANT = {"attempts": 0, "lease_token": None, "lease_expires_at": None}
    # what each parameter is: a constant, the payload, a time (deliver or send), a key value
    _CONST, _PAYLOAD, _DELIVER, _SENT, _KEY = range(5)

    def __init__(self, model: type[Queue], using: str) -> None:
        connection = connections[using]
        quote = connection.ops.quote_name
        meta = model._meta
        self.using = using
        self.label = meta.label
        self.key_names = key_names(model)
        self.text = payload_type(model) != BYTES  # a text column: STRING or JSON payloads
        fields = list(meta.local_concrete_fields)
        plan: list[tuple[int, Any, Any]] = []  # (what, field, constant or key attname)
        plain = True
        for f in fields:
            if (
                getattr(f, "db_returning", False)
                or (hasattr(f, "has_db_default") and f.has_db_default())
                or (hasattr(f, "get_placeholder") and not isinstance(f, BinaryField))
            ):
                plain = False
            elif f.attname in self.key_names:
                plan.append((self._KEY, f, f.attname))
            elif f.name == "payload":
                plan.append((self._PAYLOAD, f, None))
            elif f.name == "deliver_time":
                plan.append((self._DELIVER, f, None))
            elif f.name == "send_time":
                plan.append((self._SENT, f, None))
            elif f.name in self._CONSTANT:
                plan.append(
                    (self._CONST, f, f.get_db_prep_save(self._CONSTANT[f.name], connection))
                )
            else:
                plain = False
        self.plan = tuple(plan)
        # the parameters with the constants in place, and where the per-message ones go
        self.template = tuple(extra if what == self._CONST else None for what, _f, extra in plan)
        self.varying = tuple(
            (i, what, f, extra) for i, (what, f, extra) in enumerate(plan) if what != self._CONST
        )
        # Plain DateTimeFields prepare an aware datetime as the backend adapts it (what
        # get_db_prep_save comes to for one, without its checks for naive values).
        self.plain_times = all(
            type(f) is DateTimeField for what, f, _ in plan if what in (self._DELIVER, self._SENT)
        )
        columns = ", ".join(quote(f.column) for f in fields)
        values = ", ".join(
            # a bytes payload: never NULL (BinaryField's placeholder, e.g. MySQL's _binary)
            # (BinaryField.get_placeholder is Django 5.2's; django-stubs 5.2.9 lacks it)
            f.get_placeholder(b"", None, connection)  # type: ignore[attr-defined]
            if isinstance(f, BinaryField)
            else "%s"
            for f in fields
        )
        table = quote(meta.db_table)
        self.sql = f"INSERT INTO {table} ({columns}) VALUES ({values})" if plain else None

    def send(self, m: OutgoingMessage, now: datetime) -> Message:
        """Insert ``m`` (sent at ``now``, an aware datetime) and return it as sent; only where
        ``sql`` is not None."""
        connection = connections[self.using]  # this thread's
        # A deliver time in the past means "now", as Spanner does for Send.
        deliver_time = max(m.deliver_time, now) if m.deliver_time else now
        key = m.key
        if self.plain_times:
            adapt = connection.ops.adapt_datetimefield_value
            sent = adapt(now)
            due = sent if deliver_time is now else adapt(deliver_time)
        params = list(self.template)
        for i, what, f, extra in self.varying:
            if what == self._KEY:
                params[i] = f.get_db_prep_save(key[extra], connection)
            elif what == self._PAYLOAD:
                payload = stored_text(m.payload) if self.text else m.payload
                params[i] = f.get_db_prep_save(payload, connection)
            elif not self.plain_times:
                value = now if what == self._SENT else deliver_time
                params[i] = f.get_db_prep_save(value, connection)
            else:
                params[i] = sent if what == self._SENT else due
        with connection.cursor() as cursor:
            # str: callers send only where the statement has SQL (``insert.sql is not None``)
            cursor.execute(cast("str", self.sql), params)
        return _sent_message(
            self.label, tuple(key[n] for n in self.key_names), self.key_names, m.payload,
            deliver_time, now,
        )  # fmt: skip


_new = object.__new__
_set = object.__setattr__  # what a frozen dataclass's own __init__ calls per field
# _sent_message sets every field of Message: it must learn of any new one
assert tuple(f.name for f in dataclass_fields(Message)) == (
    "queue", "key", "key_names", "payload", "deliver_time", "attempt", "lease_token",
    "lease_expires_at", "send_time",
), "Message changed: update _sent_message"  # fmt: skip


def _sent_message(
    queue: str,
    key: tuple[Any, ...],
    key_names: tuple[str, ...],
    payload: bytes,
    deliver_time: datetime,
    send_time: datetime,
) -> Message:
    """``Message(queue=..., ..., attempt=0, send_time=...)`` of a message just sent, built as
    its ``__init__`` does but without keyword arguments (a third of the time, on every send)."""
    message = _new(Message)
    _set(message, "queue", queue)
    _set(message, "key", key)
    _set(message, "key_names", key_names)
    _set(message, "payload", payload)
    _set(message, "deliver_time", deliver_time)
    _set(message, "attempt", 0)
    _set(message, "lease_token", None)
    _set(message, "lease_expires_at", None)
    _set(message, "send_time", send_time)
    return message


def row_statements(model: type[Queue], using: str) -> RowStatements:
    """The hand-compiled statements of ``model`` on database ``using``."""
    statements = _cache.get((model, using))
    if statements is None:
        statements = _cache.setdefault((model, using), RowStatements(model, using))
    return statements


def pick_due(model: type[Queue], due: QuerySet[Any], max_messages: int, window: int) -> Q | None:
    """The keys of ``max_messages`` rows picked at random among the first
    ``window * max_messages`` of ``due`` in deliver-time order (None: nothing is due), read
    outside any read-write transaction. A claim that then reads only these rows locks only
    them, instead of the head of the DeliverTime index that every claimer reads: N claimers
    collide only when they pick the same row (about ``(N - 1) / window`` of claims)."""
    head = due.order_by("deliver_time").values_list(*key_names(model))
    keys = list(head[: max_messages * window])
    if not keys:
        return None
    chosen = random.sample(keys, min(max_messages, len(keys)))
    return Q(*[key_filter(model, tuple(k)) for k in chosen], _connector=Q.OR)


def queue_stats(model: type[Queue], manager: QuerySet[Any]) -> QueueStats:
    """One aggregate query: every count comes from the same snapshot, so they always add up
    (``total = ready + scheduled + leased``) even while messages arrive and leave."""
    now = clock.now()
    leased = Q(lease_expires_at__isnull=False, lease_expires_at__gt=now)
    counted = manager.aggregate(
        total=Count("deliver_time"),
        ready=Count("deliver_time", filter=Q(deliver_time__lte=now) & ~leased),
        leased=Count("deliver_time", filter=leased),
        oldest=Min("send_time"),
        max_attempts=Max("attempts"),
    )
    total, ready, leased_count = counted["total"], counted["ready"], counted["leased"]
    return QueueStats(
        queue=model._meta.label,
        total=total,
        ready=ready,
        leased=leased_count,
        scheduled=total - ready - leased_count,
        oldest_send_time=counted["oldest"],
        max_attempts=counted["max_attempts"],
        measured_at=now,
    )
