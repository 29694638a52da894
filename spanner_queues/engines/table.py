"""The table engine: Spanner queue semantics on an ordinary table, on any Django database.

The queue table holds the user's key columns, ``Payload`` and ``DeliverTime`` plus bookkeeping
(``send_time``, ``attempts``, ``lease_token``, ``lease_expires_at``). A message is due when
``DeliverTime <= now``; a claim moves ``DeliverTime`` past the lease expiry plus the back-off
for that attempt, so one indexed range scan on ``DeliverTime`` finds every due message, and a
message whose lease expires without an ack becomes due again after its back-off. A claim is a
short read-write transaction (SQLite: ``BEGIN IMMEDIATE``; Spanner: serialisable, retried on
ABORTED) that reads the due rows and updates each with a compare-and-set on its deliver time.
"""

from __future__ import annotations

import secrets
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import IntegrityError, connections, transaction
from django.db.models import BinaryField, Count, DateTimeField, Max, Min, Q
from django.utils import timezone

from spanner_queues.drivers import driver_for
from spanner_queues.engines.base import BaseQueueEngine, EngineFeatures, QueueStats
from spanner_queues.exceptions import (
    InvalidMessage,
    LeaseLost,
    MessageAlreadyAcked,
    MessageAlreadyExists,
    StaleAck,
)
from spanner_queues.keys import key_fields, key_filter, key_names, row_to_message
from spanner_queues.message import Message, OutgoingMessage
from spanner_queues.options import queue_options
from spanner_queues.payload import BYTES, payload_type, stored_text
from spanner_queues.storage import rows
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions


class _RowStatements:
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


class _InsertStatement:
    """One message's INSERT as ``bulk_create`` writes it (every concrete column, in model
    order), written once per queue and database, without building a model instance: the key,
    payload and time parameters are prepared per message by their fields as the ORM prepares
    them (``get_db_prep_save``), the constant ones (``attempts`` 0, no lease) once. ``sql`` is
    None where the ORM must write the row: a column filled by the database (auto-increment
    key, ``db_default``), a custom placeholder, or a column this statement does not know."""

    __slots__ = ("key_names", "label", "plain_times", "plan", "sql", "text", "using")

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
        # Plain DateTimeFields prepare an aware datetime as the backend adapts it (what
        # get_db_prep_save comes to for one, without its checks for naive values).
        self.plain_times = all(
            type(f) is DateTimeField for what, f, _ in plan if what in (self._DELIVER, self._SENT)
        )
        columns = ", ".join(quote(f.column) for f in fields)
        values = ", ".join(
            # a bytes payload: never NULL (BinaryField's placeholder, e.g. MySQL's _binary)
            f.get_placeholder(b"", None, connection) if isinstance(f, BinaryField) else "%s"
            for f in fields
        )
        table = quote(meta.db_table)
        self.sql = f"INSERT INTO {table} ({columns}) VALUES ({values})" if plain else None

    def send(self, m: OutgoingMessage, now: datetime) -> Message:
        """Insert ``m`` (sent at ``now``, an aware datetime) and return it as sent."""
        connection = connections[self.using]  # this thread's
        # A deliver time in the past means "now", as Spanner does for Send.
        deliver_time = max(m.deliver_time, now) if m.deliver_time else now
        key = m.key
        if self.plain_times:
            adapt = connection.ops.adapt_datetimefield_value
            sent = adapt(now)
            due = sent if deliver_time is now else adapt(deliver_time)
        params = []
        for what, f, extra in self.plan:
            if what == self._KEY:
                params.append(f.get_db_prep_save(key[extra], connection))
            elif what == self._CONST:
                params.append(extra)
            elif what == self._PAYLOAD:
                payload = stored_text(m.payload) if self.text else m.payload
                params.append(f.get_db_prep_save(payload, connection))
            elif not self.plain_times:
                value = now if what == self._SENT else deliver_time
                params.append(f.get_db_prep_save(value, connection))
            else:
                params.append(sent if what == self._SENT else due)
        with connection.cursor() as cursor:
            cursor.execute(self.sql, params)
        return Message(
            queue=self.label,
            key=tuple(key[n] for n in self.key_names),
            key_names=self.key_names,
            payload=m.payload,
            deliver_time=deliver_time,
            attempt=0,
            send_time=now,
        )


#: leases found expired when their message was claimed again, per (alias, queue label), in
#: this process (engines are per thread; the count is the process's)
_lease_expirations: Counter[tuple[str, str]] = Counter()
_lease_expirations_lock = threading.Lock()


class TableQueueEngine(BaseQueueEngine):
    """Queues as ordinary tables: SQLite (the embedded default), the Spanner emulator, any
    Spanner or PostgreSQL database."""

    features = EngineFeatures(supports_native_queues=False, supports_lease_checked_ack=True)

    def _statements(self, model: type[Queue], using: str) -> _RowStatements:
        cache: dict[tuple[type[Queue], str], _RowStatements] = self.__dict__.setdefault(
            "_row_statements", {}
        )
        statements = cache.get((model, using))
        if statements is None:  # (the SQL is the same for every thread's connection)
            statements = cache[(model, using)] = _RowStatements(model, using)
        return statements

    # --- schema ---------------------------------------------------------------------------
    def create_queue(
        self,
        schema_editor: BaseDatabaseSchemaEditor,
        model: type[Queue],
        options: QueueOptions,
    ) -> None:
        parent_field = options.interleave_in_parent
        driver = driver_for(schema_editor.connection.alias)
        if not (parent_field and driver.supports_interleave):
            # Elsewhere the parent's ForeignKey(on_delete=CASCADE) stands in for interleaving.
            schema_editor.create_model(model)
            return
        parent = model._meta.get_field(parent_field).related_model
        clause = (
            f", INTERLEAVE IN PARENT {schema_editor.quote_name(parent._meta.db_table)} "
            "ON DELETE CASCADE"
        )
        prefix = f"CREATE TABLE {schema_editor.quote_name(model._meta.db_table)} "
        execute = schema_editor.execute

        def execute_interleaved(sql: Any, params: Any = ()) -> Any:
            if isinstance(sql, str) and sql.startswith(prefix):
                sql += clause
            return execute(sql, params)

        schema_editor.execute = execute_interleaved  # type: ignore[method-assign]
        try:
            schema_editor.create_model(model)
        finally:
            del schema_editor.execute

    def drop_queue(
        self,
        schema_editor: BaseDatabaseSchemaEditor,
        model: type[Queue],
        options: QueueOptions,
    ) -> None:
        schema_editor.delete_model(model)

    # --- sending --------------------------------------------------------------------------
    def send_many(
        self, model: type[Queue], messages: Sequence[OutgoingMessage], *, using: str
    ) -> list[Message]:
        now = timezone.now()
        parent_field = queue_options(model).interleave_in_parent
        if parent_field and not driver_for(using).supports_interleave:
            self._check_parents(model, parent_field, messages, using)
        try:
            if len(messages) == 1:
                insert = self._insert_statement(model, using)
                if insert.sql is not None:  # one message (an outbox send): no ORM at all
                    return [insert.send(messages[0], now)]
            text = payload_type(model) != BYTES  # a text column: STRING or JSON payloads
            new_rows = [
                model(
                    **m.key,
                    payload=stored_text(m.payload) if text else m.payload,
                    # A deliver time in the past means "now", as Spanner does for Send.
                    deliver_time=max(m.deliver_time, now) if m.deliver_time else now,
                    send_time=now,
                    attempts=0,
                )
                for m in messages
            ]
            rows(model, using).bulk_create(new_rows)
        except Exception as exc:
            keys = ", ".join(str(tuple(m.key.values())) for m in messages)
            driver = driver_for(using)
            if isinstance(exc, IntegrityError) and driver.is_duplicate_key(exc):
                raise MessageAlreadyExists(
                    f"{model._meta.label}: a message with key {keys} already exists "
                    "(keys are identity; ack it first or use replace())."
                ) from exc
            if driver.is_missing_parent(exc):
                raise InvalidMessage(
                    f"{model._meta.label}: no parent row for key {keys} (the queue is "
                    "interleaved in its parent; create the parent first)."
                ) from exc
            raise
        return [row_to_message(model, r) for r in new_rows]

    def _insert_statement(self, model: type[Queue], using: str) -> _InsertStatement:
        cache: dict[tuple[type[Queue], str], _InsertStatement] = self.__dict__.setdefault(
            "_insert_statements", {}
        )
        statement = cache.get((model, using))
        if statement is None:  # (the SQL is the same for every thread's connection)
            statement = cache[(model, using)] = _InsertStatement(model, using)
        return statement

    @staticmethod
    def _check_parents(
        model: type[Queue], parent_field: str, messages: Sequence[OutgoingMessage], using: str
    ) -> None:
        """Where the database has no INTERLEAVE, refuse messages whose parent row is missing,
        as Spanner does."""
        field = model._meta.get_field(parent_field)
        wanted = {m.key[field.attname] for m in messages}
        parent = field.related_model
        found = set(
            parent._base_manager.using(using).filter(pk__in=wanted).values_list("pk", flat=True)
        )
        missing = wanted - found
        if missing:
            raise InvalidMessage(
                f"{model._meta.label}: no {parent._meta.label} row with key "
                f"{sorted(missing)!r} (the queue is interleaved in it; create the parent first)."
            )

    # --- receiving ------------------------------------------------------------------------
    def receive(
        self, model: type[Queue], *, max_messages: int = 1, lease: timedelta | None = None
    ) -> list[Message]:
        lease = lease or self.params.lease
        manager = rows(model, self.database)

        if not manager.filter(deliver_time__lte=timezone.now()).exists():
            # Nothing due: answered by a read outside any write transaction, so idle receivers
            # take no write lock (SQLite) and no read-write transaction (Spanner).
            return []

        statements = self._statements(model, self.database)
        skip_locked = driver_for(self.database).claims_skip_locked

        expired = [0]

        def claim() -> list[Message]:
            expired[0] = 0
            now = timezone.now()
            rows_due = manager.filter(deliver_time__lte=now).order_by("deliver_time")
            if skip_locked:  # rows another claim holds are passed over, not waited for
                rows_due = rows_due.select_for_update(skip_locked=True)
            due = list(rows_due[:max_messages])
            claimed = []
            for row in due:
                attempt = row.attempts + 1
                token = secrets.token_urlsafe(18)
                expires = now + lease
                age = now - (row.send_time or now)
                message = row_to_message(model, row)
                # compare-and-set on the deliver time just read
                updated = statements.claim(
                    message.key,
                    row.deliver_time,
                    lease_token=token,
                    lease_expires_at=expires,
                    attempts=attempt,
                    deliver_time=expires + self.params.backoff.delay(attempt, age),
                )
                if updated == 1:  # 0 only if another claimer won (SQLite without IMMEDIATE)
                    # a lease still set: the last one ran out (acks delete, releases clear it)
                    expired[0] += row.lease_expires_at is not None
                    claimed.append(
                        replace(
                            message, attempt=attempt, lease_token=token, lease_expires_at=expires
                        )
                    )
            return claimed

        claimed = run_in_transaction(
            claim, using=self.database, retries=self.params.transaction_retries
        )
        if expired[0]:
            with _lease_expirations_lock:
                _lease_expirations[(self.alias, model._meta.label)] += expired[0]
        return claimed

    def lease_expirations(self, model: type[Queue]) -> int:
        """Counted when a message whose lease ran out is claimed again (by this process)."""
        return _lease_expirations[(self.alias, model._meta.label)]

    def renew_leases(self, model: type[Queue], messages: Sequence[Message]) -> list[Message]:
        manager = rows(model, self.database)
        lease = self.params.lease

        def renew() -> list[Message]:
            now = timezone.now()
            renewed = []
            for msg in messages:
                if msg.lease_token is None:
                    continue
                token = secrets.token_urlsafe(18)
                expires = now + lease
                age = now - (msg.send_time or now)
                n = manager.filter(
                    key_filter(model, msg.key),
                    lease_token=msg.lease_token,
                    lease_expires_at__gt=now,
                )._update_bookkeeping(
                    lease_token=token,
                    lease_expires_at=expires,
                    deliver_time=expires + self.params.backoff.delay(msg.attempt, age),
                )
                if n == 1:
                    renewed.append(replace(msg, lease_token=token, lease_expires_at=expires))
            return renewed

        return run_in_transaction(
            renew, using=self.database, retries=self.params.transaction_retries
        )

    def release(
        self, model: type[Queue], message: Message, *, deliver_time: datetime | None = None
    ) -> None:
        manager = rows(model, self.database)

        def release() -> None:
            now = timezone.now()
            n = manager.filter(
                key_filter(model, message.key),
                lease_token=message.lease_token,
                lease_expires_at__gt=now,
            )._update_bookkeeping(
                lease_token=None,
                lease_expires_at=None,
                deliver_time=max(deliver_time, now) if deliver_time else now,
            )
            if n != 1:
                raise LeaseLost(f"{message}: the lease is no longer held; nothing released.")

        run_in_transaction(release, using=self.database, retries=self.params.transaction_retries)

    # --- acking ---------------------------------------------------------------------------
    def ack_many(
        self,
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        *,
        using: str,
        lease_tokens: Sequence[str | None] | None = None,
    ) -> None:
        """Delete the messages by key, all or none. With ``lease_tokens`` (one per key; None: by
        key alone), a message whose row no longer holds that token (its lease expired and it was
        delivered again, released, or replaced under the same key) is not deleted: ``StaleAck``.
        On either failure the caller's transaction is marked for rollback."""
        tokens = list(lease_tokens) if lease_tokens is not None else [None] * len(keys)
        if len(tokens) != len(keys):
            raise ValueError("lease_tokens must give one token (or None) per key.")
        try:
            if len(keys) == 1:
                self._ack_one(model, keys[0], tokens[0], using)
            else:
                self._ack_several(model, keys, tokens, using)
        except (MessageAlreadyAcked, StaleAck):
            if connections[using].in_atomic_block:
                transaction.set_rollback(True, using=using)
            raise

    def _ack_one(
        self, model: type[Queue], key: tuple[Any, ...], token: str | None, using: str
    ) -> None:
        statements = self._statements(model, using)
        if driver_for(using).replays_aborted_transactions:
            # Read the row first: the DB-API checks what a replay fetches, not row counts, so
            # a replay after the row was acked or claimed by another fails (and is retried from
            # the start) instead of committing the caller's work without this DELETE.
            held = statements.held_by(key)
            if held and token is not None and held[0] != token:
                raise self._stale(model, key)
            if not held:
                raise self._already_acked(model, key)
        if statements.delete(key, token) == 1:
            return
        if token is not None and rows(model, using).filter(key_filter(model, key)).exists():
            raise self._stale(model, key)
        raise self._already_acked(model, key)

    @staticmethod
    def _stale(model: type[Queue], key: tuple[Any, ...]) -> StaleAck:
        return StaleAck(
            f"{model._meta.label}{tuple(key)!r}: the lease this ack holds is no longer the "
            "message's (it expired and the message was delivered again, released or "
            "replaced under the same key); nothing acked. Roll back."
        )

    @staticmethod
    def _already_acked(model: type[Queue], key: tuple[Any, ...]) -> MessageAlreadyAcked:
        return MessageAlreadyAcked(
            f"{model._meta.label}{tuple(key)!r}: no such message; it was already acked "
            "(or deleted). Roll back: the work may have been done by another receiver."
        )

    def _ack_several(
        self,
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        tokens: Sequence[str | None],
        using: str,
    ) -> None:
        duplicates = {k for k, n in Counter(map(tuple, keys)).items() if n > 1}
        if duplicates:
            raise MessageAlreadyAcked(
                f"{model._meta.label}: key(s) {sorted(duplicates)!r} given twice; a message is "
                "acked at most once."
            )
        manager = rows(model, using)
        by_key = Q(*[key_filter(model, k) for k in keys], _connector=Q.OR)
        condition = Q(
            *[
                key_filter(model, k) & Q(lease_token=t) if t is not None else key_filter(model, k)
                for k, t in zip(keys, tokens, strict=True)
            ],
            _connector=Q.OR,
        )
        names = key_names(model)

        def delete_all() -> None:
            # All or nothing even in autocommit: the count of the DELETE itself decides, so a
            # concurrent ack between reading and deleting cannot make both callers succeed.
            present = set(manager.filter(by_key).values_list(*names))
            missing = [k for k in keys if tuple(k) not in present]
            if not missing and any(t is not None for t in tokens):
                held = set(manager.filter(condition).values_list(*names))
                stale = [k for k in keys if tuple(k) not in held]
                if stale:
                    raise StaleAck(
                        f"{model._meta.label}: the lease of {stale!r} is no longer the "
                        "message's (delivered again, released or replaced under the same "
                        "key); nothing acked. Roll back."
                    )
            if not missing and manager.filter(condition)._raw_delete(using) == len(keys):
                return
            raise MessageAlreadyAcked(
                f"{model._meta.label}: no message with key(s) {missing!r}; already acked (or "
                "deleted). Roll back the transaction."
            )

        with transaction.atomic(using=using):
            delete_all()

    def delete_any(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> None:
        if keys:
            by_key = Q(*[key_filter(model, k) for k in keys], _connector=Q.OR)
            rows(model, using).filter(by_key).delete()

    # --- observing ------------------------------------------------------------------------
    def stats(self, model: type[Queue]) -> QueueStats:
        """One aggregate query: every count comes from the same snapshot, so they always add up
        (``total = ready + scheduled + leased``) even while messages arrive and leave."""
        manager = rows(model, self.database)
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

    def check(self) -> list[checks.CheckMessage]:
        return driver_for(self.database).check()
