"""The table engine: Spanner queue semantics on an ordinary table, on any Django database.

The queue table holds the user's key columns, ``Payload`` and ``DeliverTime`` plus bookkeeping
(``send_time``, ``attempts``, ``lease_token``, ``lease_expires_at``). A message is due when
``DeliverTime <= now``; a claim moves ``DeliverTime`` past the lease expiry plus the back-off
for that attempt, so one indexed range scan on ``DeliverTime`` finds every due message, and a
message whose lease expires without an ack becomes due again after its back-off. A claim is a
short read-write transaction (SQLite: ``BEGIN IMMEDIATE``; Spanner: serialisable, retried on
ABORTED) that reads the due rows and updates each with a compare-and-set on its deliver time;
on PostgreSQL it passes over rows other claims hold (``SKIP LOCKED``), on Spanner it reads only
rows picked at random among the first due ones (``Driver.claim_window``). Acks are in
``table_acks``, the hand-compiled per-message SQL in ``table_sql``.
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
from django.db import IntegrityError
from django.db.models import Q

from spanner_queues import clock
from spanner_queues.drivers import driver_for
from spanner_queues.engines.base import BaseQueueEngine, EngineFeatures, QueueStats
from spanner_queues.engines.table_acks import TableAcks
from spanner_queues.engines.table_sql import (
    Claim,
    InsertStatement,
    RowStatements,
    pick_due,
    queue_stats,
    row_statements,
)
from spanner_queues.exceptions import (
    InvalidMessage,
    LeaseLost,
    MessageAlreadyExists,
)
from spanner_queues.keys import column_field, key_filter, key_names, parent_model, row_to_message
from spanner_queues.message import Message, OutgoingMessage
from spanner_queues.options import queue_options
from spanner_queues.payload import BYTES, from_stored, payload_type, stored_text
from spanner_queues.storage import rows
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions


#: leases found expired when their message was claimed again, per (alias, queue label), in
#: this process (engines are per thread; the count is the process's)
_lease_expirations: Counter[tuple[str, str]] = Counter()
_lease_expirations_lock = threading.Lock()


class TableQueueEngine(TableAcks, BaseQueueEngine):
    """Queues as ordinary tables: SQLite (the embedded default), the Spanner emulator, any
    Spanner or PostgreSQL database."""

    features = EngineFeatures(supports_native_queues=False, supports_lease_checked_ack=True)

    def _statements(self, model: type[Queue], using: str) -> RowStatements:
        return row_statements(model, using)

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
        parent = parent_model(model, parent_field)
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

        # an instance attribute over the method, for this create_model only (deleted below)
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
        now = clock.now()
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

    def _insert_statement(self, model: type[Queue], using: str) -> InsertStatement:
        cache: dict[tuple[type[Queue], str], InsertStatement] = self.__dict__.setdefault(
            "_insert_statements", {}
        )
        statement = cache.get((model, using))
        if statement is None:  # (the SQL is the same for every thread's connection)
            statement = cache[(model, using)] = InsertStatement(model, using)
        return statement

    @staticmethod
    def _check_parents(
        model: type[Queue], parent_field: str, messages: Sequence[OutgoingMessage], using: str
    ) -> None:
        """Where the database has no INTERLEAVE, refuse messages whose parent row is missing,
        as Spanner does."""
        wanted = {m.key[column_field(model, parent_field).attname] for m in messages}
        parent = parent_model(model, parent_field)
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
        self,
        model: type[Queue],
        *,
        max_messages: int = 1,
        lease: timedelta | None = None,
        wait: float | None = None,
    ) -> list[Message]:
        lease = lease or self.params.lease
        manager = rows(model, self.database)

        driver = driver_for(self.database)
        # Nothing due: answered by a read outside any write transaction, so idle receivers
        # take no write lock (SQLite) and no read-write transaction (Spanner). Right after a
        # claim that came back full (a backlog) the claim itself asks: one read less per
        # claim while draining; a claim that finds fewer than it asked for ends the backlog.
        backlog: set[type[Queue]] = self.__dict__.setdefault("_backlog", set())
        picked = None
        statements = self._statements(model, self.database)
        if driver.claim_window:  # no SKIP LOCKED: claim due rows picked at random (Spanner)
            due_now = manager.filter(deliver_time__lte=clock.now())
            picked = pick_due(model, due_now, max_messages, driver.claim_window)
            if picked is None:
                return []
        elif model not in backlog and not statements.any_due(clock.now()):
            return []

        skip_locked = driver.claims_skip_locked
        # One executemany per claim, except where the DB-API replays aborted transactions
        # (Spanner), whose replay checks fetched rows, not counts: one UPDATE per row there.
        one_by_one = driver.replays_aborted_transactions
        names = key_names(model)
        n_keys = len(names)
        columns = (*names, *statements.DUE_COLUMNS)
        label = model._meta.label

        expired = [0]

        def claim(keys: Q | None) -> list[Message]:
            expired[0] = 0
            now = clock.now()
            if keys is None and not one_by_one:  # the statement written once (table_sql)
                # rows another claim holds are passed over, not waited for (skip_locked)
                due = statements.select_due(now, max_messages, skip_locked=skip_locked)
            else:
                rows_due = manager.filter(deliver_time__lte=now).order_by("deliver_time")
                if keys is not None:  # read (and lock) only the rows picked
                    rows_due = rows_due.filter(keys)
                if skip_locked:
                    rows_due = rows_due.select_for_update(skip_locked=True)
                # values, not model instances: the claim needs only these columns
                due = list(rows_due.values_list(*columns)[:max_messages])
            expires = now + lease
            backoff = self.params.backoff
            wanted = []
            for row in due:
                payload, deliver_time, send_time, attempts, lease_expires_at = row[n_keys:]
                attempt = attempts + 1
                age = now - (send_time or now)
                wanted.append(
                    Claim(
                        key=row[:n_keys],
                        was_due=deliver_time,  # compare-and-set on the deliver time just read
                        lease_token=secrets.token_urlsafe(18),
                        lease_expires_at=expires,
                        attempts=attempt,
                        deliver_time=expires + backoff.delay(attempt, age),
                    )
                )
            if one_by_one:
                updated = [statements.claim(c.key, c.was_due, **c.changes()) == 1 for c in wanted]
            else:
                updated = statements.claim_many(wanted)
            claimed = []
            for row, c, won in zip(due, wanted, updated, strict=True):
                if won:  # False only if another claimer won (SQLite without IMMEDIATE)
                    payload, deliver_time, send_time, _, lease_expires_at = row[n_keys:]
                    # a lease still set: the last one ran out (acks delete, releases clear it)
                    expired[0] += lease_expires_at is not None
                    claimed.append(
                        Message(
                            queue=label,
                            key=c.key,
                            key_names=names,
                            payload=from_stored(payload),
                            deliver_time=deliver_time,
                            attempt=c.attempts,
                            lease_token=c.lease_token,
                            lease_expires_at=expires,
                            send_time=send_time,
                        )
                    )
            return claimed

        retries = self.params.transaction_retries
        claimed = run_in_transaction(lambda: claim(picked), using=self.database, retries=retries)
        if picked is not None and not claimed:  # all taken meanwhile: from the head, as elsewhere
            claimed = run_in_transaction(lambda: claim(None), using=self.database, retries=retries)
        if len(claimed) >= max_messages:
            backlog.add(model)
        else:
            backlog.discard(model)
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
            now = clock.now()
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
                    # (the table engine always counts: attempt is never None here)
                    deliver_time=expires + self.params.backoff.delay(msg.attempt or 1, age),
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
            now = clock.now()
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

    # --- observing ------------------------------------------------------------------------
    def stats(self, model: type[Queue]) -> QueueStats:
        return queue_stats(model, rows(model, self.database))

    def check(self) -> list[checks.CheckMessage]:
        return driver_for(self.database).check()
