"""The table engine's SQL: the hand-compiled per-message statements of the hot path, the claim
window, and the stats aggregate.

Written once per queue and database alias (``row_statements``, for every thread); what they
save over the equivalent querysets is measured by ``benchmarks/hand_sql_vs_orm.py``
(docs/benchmarks.md).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import BinaryField, Count, Max, Min, Q, QuerySet
from django.utils import timezone

from spanner_queues.engines.base import QueueStats
from spanner_queues.keys import key_fields, key_filter, key_names

if TYPE_CHECKING:
    from spanner_queues.models import Queue


class RowStatements:
    """The two per-message statements of the hot path, written once per queue and database
    in the backend's own quoting, with parameters prepared by the fields as the ORM prepares
    them (``get_db_prep_save`` for SET, ``get_prep_value``/``get_db_prep_value`` for ``=``):
    the same SQL as ``filter(<key>, deliver_time=...).update(...)`` and
    ``filter(<key>)._raw_delete()``, without rebuilding and compiling a query per message."""

    __slots__ = (
        "claim_sql",
        "delete_leased_sql",
        "delete_sql",
        "fields",
        "insert_fields",
        "insert_sql",
        "key",
        "token_sql",
        "using",
    )

    def __init__(self, model: type[Queue], using: str) -> None:
        quote = connections[using].ops.quote_name
        meta = model._meta
        self.using = using
        self.key = key_fields(model)
        self.fields = {
            name: meta.get_field(name)
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
        # One message's INSERT, as bulk_create writes it, unless a column is filled by the
        # database (auto-increment keys, db_default) or needs a custom placeholder: then
        # bulk_create it stays.
        connection = connections[using]
        fields = list(meta.local_concrete_fields)
        plain = all(
            not getattr(f, "db_returning", False)
            and not (hasattr(f, "has_db_default") and f.has_db_default())
            and (not hasattr(f, "get_placeholder") or isinstance(f, BinaryField))
            for f in fields
        )
        self.insert_fields = fields if plain else None
        columns = ", ".join(quote(f.column) for f in fields)
        values = ", ".join(
            # a bytes payload: never NULL (BinaryField's placeholder, e.g. MySQL's _binary)
            f.get_placeholder(b"", None, connection) if isinstance(f, BinaryField) else "%s"
            for f in fields
        )
        self.insert_sql = f"INSERT INTO {table} ({columns}) VALUES ({values})"

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

    def insert(self, row: Queue) -> None:
        connection = connections[self.using]
        params = [
            f.get_db_prep_save(f.pre_save(row, True), connection) for f in self.insert_fields or ()
        ]
        with connection.cursor() as cursor:
            cursor.execute(self.insert_sql, params)
        row._state.adding = False
        row._state.db = self.using

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
    now = timezone.now()
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
