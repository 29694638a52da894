"""The table engine: Spanner queue semantics on an ordinary table, on any Django database.

The queue table holds the user's key columns, ``Payload`` and ``DeliverTime`` plus bookkeeping
(``send_time``, ``attempts``, ``lease_token``, ``lease_expires_at``). A message is due when
``DeliverTime <= now``; a claim moves ``DeliverTime`` past the lease expiry plus the back-off
for that attempt, so one indexed range scan on ``DeliverTime`` finds every due message, and a
message whose lease expires without an ack becomes due again after its back-off. A claim is a
short read-write transaction (SQLite: ``BEGIN IMMEDIATE``; Spanner: serialisable, retried on
ABORTED) that reads the due rows and updates each with a compare-and-set on its deliver time;
on PostgreSQL it passes over rows other claims hold (``SKIP LOCKED``), on Spanner it reads only
rows picked at random among the first due ones (``Driver.claim_window``). An ack deletes by key,
all or none, checked against the lease token.

The hot path (one send, a claim, an ack) runs hand-compiled statements written once per queue
and database (``RowStatements``, ``InsertStatement``, below the engine); what they save over the
equivalent querysets is measured by ``benchmarks/hand_sql_vs_orm.py`` (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import itertools
import json
import operator
import random
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields as dataclass_fields
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from django.core import checks
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import (
    BigIntegerField,
    BinaryField,
    CharField,
    Count,
    DateTimeField,
    Field,
    IntegerField,
    Max,
    Min,
    PositiveBigIntegerField,
    PositiveIntegerField,
    PositiveSmallIntegerField,
    Q,
    QuerySet,
    SmallIntegerField,
    TextField,
)

from spanner_queues import clock
from spanner_queues.drivers import causes, driver_for, driver_of
from spanner_queues.engines.base import BaseQueueEngine, EngineFeatures, QueueStats
from spanner_queues.exceptions import (
    InvalidMessage,
    LeaseLost,
    MessageAlreadyAcked,
    MessageAlreadyExists,
    StaleAck,
)
from spanner_queues.keys import (
    column_field,
    key_fields,
    key_filter,
    key_names,
    parent_model,
    row_to_message,
)
from spanner_queues.message import Message, OutgoingMessage, leased_message
from spanner_queues.options import queue_options
from spanner_queues.ordering import head_of_key, head_of_key_sql, ordered_by, send_times
from spanner_queues.payload import BYTES, from_stored, payload_type, stored_text
from spanner_queues.storage import QueueQuerySet, rows_with
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions

#: leases found expired when their message was claimed again, per (alias, queue label), in
#: this process (engines are per thread; the count is the process's)
_lease_expirations: Counter[tuple[str, str]] = Counter()
_lease_expirations_lock = threading.Lock()


def _rows(model: type[Queue], using: str) -> QueueQuerySet:
    """``storage.rows`` of a queue of this engine, which keeps the bookkeeping columns (no
    lookup of the queue's engine on the hot path)."""
    return rows_with(model, using, bookkeeping=True)


class TableQueueEngine(BaseQueueEngine):
    """Queues as ordinary tables: SQLite (the embedded default), the Spanner emulator, any
    Spanner or PostgreSQL database."""

    features = EngineFeatures(
        supports_native_queues=False,
        supports_lease_checked_ack=True,
        supports_ordered_receive=True,
    )

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
        ordered = bool(ordered_by(model))
        if ordered and not connections[using].in_atomic_block:
            # the ordering keys' rows stay locked until the messages commit (``ordering``)
            with transaction.atomic(using=using):
                return self.send_many(model, messages, using=using)
        now = clock.now()
        parent_field = queue_options(model).interleave_in_parent
        if parent_field and not driver_for(using).supports_interleave:
            self._check_parents(model, parent_field, messages, using)
        # an ordered queue's messages: each one later than the last of its ordering key
        sent = send_times(model, messages, now, using=using) if ordered else None
        try:
            if len(messages) == 1 and sent is None:
                insert = row_statements(model, using).insert
                if insert.sql is not None:  # one message (an outbox send): no ORM at all
                    return [insert.send(messages[0], now)]
            text = payload_type(model) != BYTES  # a text column: STRING or JSON payloads
            new_rows = [
                model(
                    **m.key,
                    payload=stored_text(m.payload) if text else m.payload,
                    # A deliver time in the past means "now", as Spanner does for Send.
                    deliver_time=max(m.deliver_time, now) if m.deliver_time else now,
                    send_time=now if sent is None else sent[i],
                    attempts=0,
                )
                for i, m in enumerate(messages)
            ]
            _rows(model, using).bulk_create(new_rows)
        except Exception as exc:
            keys = ", ".join(str(tuple(m.key.values())) for m in messages)
            driver = driver_for(using)
            if isinstance(exc, IntegrityError) and driver.is_duplicate_key(exc):
                raise MessageAlreadyExists(
                    f"{model._meta.label}: {self._existing_text(model, messages, using, exc)} "
                    "(keys are identity; ack it first or use replace())."
                ) from exc
            if driver.is_missing_parent(exc):
                raise InvalidMessage(
                    f"{model._meta.label}: no parent row for key {keys} (the queue is "
                    "interleaved in its parent; create the parent first)."
                ) from exc
            raise
        return [row_to_message(model, r) for r in new_rows]

    @staticmethod
    def _existing_text(
        model: type[Queue], messages: Sequence[OutgoingMessage], using: str, exc: Exception
    ) -> str:
        """Which keys of ``messages`` exist ("a message with key (...) already exists"), read
        in the caller's transaction; where it cannot be read (PostgreSQL ended the
        transaction), the database's own words, which name the key there."""
        names = key_names(model)
        keys = [tuple(m.key[n] for n in names) for m in messages]
        if len(keys) == 1:
            return f"a message with key {keys[0]} already exists"
        # The failed INSERT marked the caller's ``atomic`` for rollback; it stays marked, but
        # where the database's transaction survives a failed statement, one read is allowed.
        doomed = transaction.get_rollback(using=using)
        transaction.set_rollback(False, using=using)
        try:
            query = _rows(model, using).filter(
                functools.reduce(operator.or_, [key_filter(model, k) for k in keys])
            )
            found = set(query.values_list(*names))
        except DatabaseError:
            found = set()
        finally:
            transaction.set_rollback(doomed, using=using)
        there = [k for k in keys if k in found]
        if there:
            return f"a message with key {', '.join(str(k) for k in there[:20])} already exists"
        # (the first words of the chain that say something: Django's and the DB-API's
        # wrappers of a Spanner error may say nothing, "[]")
        said = next((t for t in (" ".join(str(e).split()) for e in causes(exc)) if len(t) > 2), "")
        return f"a message with one of the {len(keys)} keys already exists ({said[:300]})"

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
        # Right after a claim that came back full (a backlog) the claim itself asks whether
        # anything is due: one read less per claim while draining; a claim that finds fewer
        # than it asked for ends the backlog.
        backlog: set[type[Queue]] = self.__dict__.setdefault("_backlog", set())
        due, picked = self._look(model, max_messages, backlog=model in backlog)
        if not due:
            return []

        def claim(keys: Q | None) -> tuple[list[Message], int]:
            claimed = run_in_transaction(
                lambda: self._claim(model, keys, max_messages, lease),
                using=self.database,
                retries=self.params.transaction_retries,
            )
            return claimed()  # the messages built once committed, the write lock let go

        claimed, expired = claim(picked)
        if picked is not None and not claimed:  # all taken meanwhile: from the head, as elsewhere
            claimed, expired = claim(None)
        if len(claimed) >= max_messages:
            backlog.add(model)
        else:
            backlog.discard(model)
        if expired:
            with _lease_expirations_lock:
                _lease_expirations[(self.alias, model._meta.label)] += expired
        return claimed

    def _look(
        self, model: type[Queue], max_messages: int, *, backlog: bool
    ) -> tuple[bool, Q | None]:
        """Whether a claim is worth a transaction, and the rows it should claim (None: the
        due rows from the head). Nothing due is answered by a read outside any write
        transaction, so idle receivers take no write lock (SQLite) and no read-write
        transaction (Spanner); with ``backlog`` (the last claim came back full) the claim
        itself asks."""
        driver = driver_for(self.database)
        if driver.claim_window:  # no SKIP LOCKED: claim due rows picked at random (Spanner)
            due_now = _rows(model, self.database).filter(deliver_time__lte=clock.now())
            head = head_of_key(model)
            if head is not None:  # an ordered queue: only each key's head (``ordering``)
                due_now = due_now.filter(head)
            picked = pick_due(model, due_now, max_messages, driver.claim_window)
            return picked is not None, picked
        if backlog:
            return True, None
        return row_statements(model, self.database).any_due(clock.now()), None

    def _claim(
        self, model: type[Queue], keys: Q | None, max_messages: int, lease: timedelta
    ) -> Callable[[], tuple[list[Message], int]]:
        """In the caller's transaction: lease up to ``max_messages`` due rows (those of
        ``keys`` when given), each with a new token and its next deliver time (the back-off
        of its next attempt). Returns a function that returns the messages claimed and how
        many of them had a lease that ran out (acks delete, releases clear it); where the
        claim is one statement it builds them then, so that the caller calls it after the
        commit (on SQLite the database's single write lock is let go sooner)."""
        driver = driver_for(self.database)
        statements = row_statements(model, self.database)
        # One executemany per claim, except where the DB-API replays aborted transactions
        # (Spanner), whose replay checks fetched rows, not counts: one UPDATE per row there.
        one_by_one = driver.replays_aborted_transactions
        now = clock.now()
        names = key_names(model)
        if keys is None and (driver.claims_in_one_statement or driver.supports_json_each):
            return self._claim_in_one_statement(model, statements, max_messages, now, lease)
        due = self._due_rows(
            model, statements, keys, max_messages, now, one_by_one=one_by_one, names=names
        )
        n_keys = len(names)
        expires = now + lease
        backoff = self.params.backoff
        # each row's token is new and its own: one random part per claim, then the row's
        # place in it (a token names one lease of one row, never compared by more than =)
        tokens = lease_tokens()
        # The deliver time after the lease (the back-off of the next attempt, should the lease
        # run out): one jittered draw per claim for each attempt, young or old (the back-off
        # depends on nothing else), so a claim's rows share a few values, each adapted once
        # (a draw and an adaptation per row were a sixth of a claim's time).
        after_lease: dict[tuple[int, bool], datetime] = {}
        wanted = []
        for row in due:
            _, deliver_time, send_time, attempts, _ = row[n_keys:]
            attempt = attempts + 1
            age = now - (send_time or now)
            group = (attempt, age >= backoff.hourly_after)
            due_again = after_lease.get(group)
            if due_again is None:
                due_again = after_lease[group] = expires + backoff.delay(attempt, age)
            wanted.append(
                Claim(
                    key=row[:n_keys],
                    was_due=deliver_time,  # compare-and-set on the deliver time just read
                    lease_token=next(tokens),
                    lease_expires_at=expires,
                    attempts=attempt,
                    deliver_time=due_again,
                )
            )
        if one_by_one:
            updated = [statements.claim(c) == 1 for c in wanted]
        else:
            updated = statements.claim_many(wanted)
        claimed, expired = [], 0
        for row, c, won in zip(due, wanted, updated, strict=True):
            if won:  # False only if another claimer won (SQLite without IMMEDIATE)
                claimed.append(_claimed_message(model._meta.label, names, row, c))
                # a lease still set: the last one ran out (acks delete, releases clear it)
                expired += row[-1] is not None  # (lease_expires_at, the last of DUE_COLUMNS)
        return lambda: (claimed, expired)

    def _claim_in_one_statement(
        self,
        model: type[Queue],
        statements: RowStatements,
        max_messages: int,
        now: datetime,
        lease: timedelta,
    ) -> Callable[[], tuple[list[Message], int]]:
        """``_claim`` of the due rows from the head as one statement (``claims_in_one_statement``;
        SQLite: a read and one statement, ``supports_json_each``): one lease token for the claim,
        and the deliver time after the lease drawn once per attempt (as ``_claim`` draws it),
        written by the statement for each row by its attempts and age. The rows are converted
        and their messages built when the returned function is called (after the commit)."""
        names = key_names(model)
        n_keys = len(names)
        expires = now + lease
        backoff = self.params.backoff
        young = timedelta(0)
        after_lease: list[tuple[int, datetime]] = []  # (attempts before, deliver time)
        for attempts in range(64):  # until the wait stops growing (the policy's maximum)
            after_lease.append((attempts, expires + backoff.delay(attempts + 1, young)))
            if backoff.longest(attempts + 2, young) == backoff.longest(attempts + 1, young):
                break
        old = (now - backoff.hourly_after, expires + backoff.delay(1, backoff.hourly_after))
        token = next(lease_tokens())
        converted = statements.claim_due(now, max_messages, token, expires, after_lease, old)
        label = model._meta.label

        def built() -> tuple[list[Message], int]:
            rows = converted()
            # (RETURNING has no order: oldest due first, as the read of ``_claim``)
            rows.sort(key=lambda row: row[n_keys + 1])
            claimed, expired = [], 0
            for row in rows:
                claim = Claim(
                    key=row[:n_keys],
                    was_due=row[n_keys + 1],
                    lease_token=token,
                    lease_expires_at=expires,
                    attempts=row[n_keys + 3] + 1,
                    deliver_time=expires,  # (unread here: the statement set it by the attempts)
                )
                claimed.append(_claimed_message(label, names, row, claim))
                expired += row[-1] is not None  # the lease it had ran out
            return claimed, expired

        return built

    def _due_rows(
        self,
        model: type[Queue],
        statements: RowStatements,
        keys: Q | None,
        max_messages: int,
        now: datetime,
        *,
        one_by_one: bool,
        names: tuple[str, ...],
    ) -> Sequence[tuple[Any, ...]]:
        """The due rows to claim, oldest due first: their keys (``names``), then
        ``DUE_COLUMNS``."""
        skip_locked = driver_for(self.database).claims_skip_locked
        if keys is None and not one_by_one:  # the statement written once (RowStatements)
            # rows another claim holds are passed over, not waited for (skip_locked)
            return statements.select_due(now, max_messages, skip_locked=skip_locked)
        rows_due = _rows(model, self.database).filter(deliver_time__lte=now)
        rows_due = rows_due.order_by("deliver_time")
        head = head_of_key(model)
        if head is not None:  # an ordered queue: only each key's head (``ordering``)
            rows_due = rows_due.filter(head)
        if keys is not None:  # read (and lock) only the rows picked
            rows_due = rows_due.filter(keys)
        if skip_locked:
            rows_due = rows_due.select_for_update(skip_locked=True)
        # values, not model instances: the claim needs only these columns
        columns = (*names, *statements.DUE_COLUMNS)
        return list(rows_due.values_list(*columns)[:max_messages])

    def lease_expirations(self, model: type[Queue]) -> int:
        """Counted when a message whose lease ran out is claimed again (by this process)."""
        return _lease_expirations[(self.alias, model._meta.label)]

    def renew_leases(self, model: type[Queue], messages: Sequence[Message]) -> list[Message]:
        manager = _rows(model, self.database)
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
                    renewed.append(
                        replace(
                            msg,
                            payload=msg.stored_payload,  # (not an envelope's data)
                            lease_token=token,
                            lease_expires_at=expires,
                        )
                    )
            return renewed

        return run_in_transaction(
            renew, using=self.database, retries=self.params.transaction_retries
        )

    def release(
        self, model: type[Queue], message: Message, *, deliver_time: datetime | None = None
    ) -> None:
        manager = _rows(model, self.database)

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
        statements = row_statements(model, using)
        if driver_for(using).replays_aborted_transactions:
            # Read the row first: the DB-API checks what a replay fetches, not row counts, so
            # a replay after the row was acked or claimed by another fails (and is retried from
            # the start) instead of committing the caller's work without this DELETE.
            held = statements.held_by(key)
            if held and token is not None and held[0] != token:
                raise _stale(model, [key])
            if not held:
                raise _already_acked(model, [key])
        if statements.delete(key, token) == 1:
            return
        if token is not None and _rows(model, using).filter(key_filter(model, key)).exists():
            raise _stale(model, [key])
        raise _already_acked(model, [key])

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
        if not driver_for(using).replays_aborted_transactions and self._delete_each(
            model, keys, tokens, using
        ):
            return
        manager = _rows(model, using)
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
                    raise _stale(model, stale)
            if not missing and manager.filter(condition)._raw_delete(using) == len(keys):
                return
            raise _already_acked(model, missing)

        with transaction.atomic(using=using):
            delete_all()

    @staticmethod
    def _delete_each(
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        tokens: Sequence[str | None],
        using: str,
    ) -> bool:
        """The common case, fast: each key's prepared DELETE (with its token) in one savepoint,
        instead of a set-based DELETE built as an ORM filter of ``len(keys)`` ORs (SQLite: batch
        receivers drained 2,541 → 6,165 msg/s, ``benchmarks/worker_vs_django_tasks_db.py``); with
        a token for every key, all in one ``executemany`` (``RowStatements.delete_many``). False
        (and nothing deleted) as soon as one finds no row: the set-based path then names every
        missing or stale key. Not where the driver replays aborted transactions (Spanner), whose
        replay checks fetched rows, not counts."""
        statements = row_statements(model, using)
        try:
            with transaction.atomic(using=using):
                if all(t is not None for t in tokens):  # the worker's acks: one executemany
                    if statements.delete_many(keys, tokens) != len(keys):
                        raise _NotAll
                    return True
                for key, token in zip(keys, tokens, strict=True):
                    if statements.delete(key, token) != 1:
                        raise _NotAll
        except _NotAll:
            return False
        return True

    def delete_any(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> None:
        if keys:
            by_key = Q(*[key_filter(model, k) for k in keys], _connector=Q.OR)
            _rows(model, using).filter(by_key).delete()

    # --- observing ------------------------------------------------------------------------
    def stats(self, model: type[Queue]) -> QueueStats:
        """One aggregate query: every count comes from the same snapshot, so they always add
        up (``total = ready + scheduled + leased``) even while messages arrive and leave."""
        now = clock.now()
        leased = Q(lease_expires_at__isnull=False, lease_expires_at__gt=now)
        counted = _rows(model, self.database).aggregate(
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


def lease_tokens() -> Iterator[str]:
    """New lease tokens, each its own: 16 random URL-safe characters (96 bits) drawn once,
    then a count (``secrets.token_urlsafe`` for each row of a claim was a tenth of the claim's
    time). At most 64 characters, the column's size."""
    prefix = secrets.token_urlsafe(12)
    return (f"{prefix}.{i}" for i in itertools.count())


def _claimed_message(
    label: str, names: tuple[str, ...], row: tuple[Any, ...], claim: Claim
) -> Message:
    """The message of a due ``row`` (keys ``names``, then ``DUE_COLUMNS``) as ``claim``
    leased it."""
    payload, deliver_time, send_time, _, _ = row[len(names) :]
    return leased_message(
        label,
        claim.key,
        names,
        from_stored(payload),
        deliver_time,
        claim.attempts,
        claim.lease_token,
        claim.lease_expires_at,
        send_time,
    )


def _named(model: type[Queue], keys: Sequence[tuple[Any, ...]]) -> str:
    """``tasks.UserTasks(1, 'welcome')``: the queue and its key(s), as the native engine and
    docs/quickstart.md word an ack's error."""
    return model._meta.label + ", ".join(repr(tuple(k)) for k in keys)


def _stale(model: type[Queue], keys: Sequence[tuple[Any, ...]]) -> StaleAck:
    return StaleAck(
        f"{_named(model, keys)}: the lease this ack holds is no longer the message's (it "
        "expired and the message was delivered again, released or replaced under the same "
        "key); nothing acked. Roll back."
    )


def _already_acked(model: type[Queue], keys: Sequence[tuple[Any, ...]]) -> MessageAlreadyAcked:
    return MessageAlreadyAcked(
        f"{_named(model, keys)}: no such message; it was already acked (or deleted). Roll "
        "back: the work may have been done by another receiver."
    )


class _NotAll(Exception):
    """One of a batch's DELETEs found no row (rolls its savepoint back)."""


class Claim(NamedTuple):
    """One row of a claim: its key and the deliver time read (compared and set), and what to
    set."""

    key: tuple[Any, ...]
    was_due: datetime
    lease_token: str
    lease_expires_at: datetime
    attempts: int
    deliver_time: datetime


#: the field types that prepare a value of this type (``get_prep_value``,
#: ``get_db_prep_value``, ``get_db_prep_save``) as the value itself: the hot path's parameters
#: skip the fields' calls for them (exact types: a subclass may prepare otherwise)
_PLAIN_FIELDS: dict[type[Field[Any, Any]], type] = {
    CharField: str,
    TextField: str,
    IntegerField: int,
    BigIntegerField: int,
    SmallIntegerField: int,
    PositiveIntegerField: int,
    PositiveBigIntegerField: int,
    PositiveSmallIntegerField: int,
}


def _preparer(field: Any, connection: Any, *, save: bool = False) -> Callable[[Any], Any]:
    """How the ORM makes ``field``'s values parameters on ``connection``: as saved (SET) with
    ``save``, else as looked up (``=``); a plain field's value of its plain type as it is, a
    plain ``DateTimeField``'s aware datetime (or None) through the backend's adapter alone
    (what the field's calls come to for it, without their checks for naive values)."""
    if save:

        def slow(value: Any) -> Any:
            return field.get_db_prep_save(value, connection)

    else:

        def slow(value: Any) -> Any:
            return RowStatements._lookup(field, value, connection)

    if type(field) is DateTimeField:
        adapt = driver_of(connection).datetime_param()

        def time(value: Any) -> Any:
            if value is None or (isinstance(value, datetime) and value.tzinfo is not None):
                return adapt(value)
            return slow(value)

        return time
    plain = _PLAIN_FIELDS.get(type(field))
    if plain is None:
        return slow
    return lambda value: value if type(value) is plain else slow(value)


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
        "due_where",
        "fields",
        "insert",
        "key",
        "table",
        "token_sql",
        "using",
        "written",
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
        due = f"{deliver} <= %s"
        head = head_of_key_sql(model, using)
        if head:  # an ordered queue: only each ordering key's head (``ordering``)
            due = f"{due} AND {head}"
        self.table = table
        self.due_where = due
        #: statements written on first use (``_written``): a few per queue and database
        self.written: dict[tuple[Any, ...], str] = {}
        self.due_sql = f"SELECT {columns} FROM {table} WHERE {due} ORDER BY {deliver} ASC"
        self.any_due_sql = f"SELECT 1 FROM {table} WHERE {due}"
        self.insert = InsertStatement(model, using)

    @staticmethod
    def _lookup(field: Any, value: Any, connection: Any) -> Any:
        return field.get_db_prep_value(field.get_prep_value(value), connection, prepared=True)

    def _key(self, key: Sequence[Any], connection: Any) -> list[Any]:
        return [self._lookup(f, v, connection) for f, v in zip(self.key, key, strict=True)]

    def _key_preparer(self, connection: Any) -> Callable[[Sequence[Any]], list[Any]]:
        """``_key`` for many keys on ``connection``: the fields' preparers found once."""
        preparers = [_preparer(f, connection) for f in self.key]
        if len(preparers) == 1:
            [prepare] = preparers
            return lambda key: [prepare(key[0])]
        return lambda key: [p(v) for p, v in zip(preparers, key, strict=True)]

    def claim(self, c: Claim) -> int:
        """``c``'s compare-and-set UPDATE; the rows it updated (1 or 0)."""
        f = self.fields
        connection = connections[self.using]  # this thread's
        params = [
            f["lease_token"].get_db_prep_save(c.lease_token, connection),
            f["lease_expires_at"].get_db_prep_save(c.lease_expires_at, connection),
            f["attempts"].get_db_prep_save(c.attempts, connection),
            f["deliver_time"].get_db_prep_save(c.deliver_time, connection),
            *self._key(c.key, connection),
            self._lookup(f["deliver_time"], c.was_due, connection),
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
        return self._converted(found, connection)

    def claim_due(
        self,
        now: datetime,
        limit: int,
        token: str,
        expires: datetime,
        after_lease: Sequence[tuple[int, datetime]],
        old: tuple[datetime, datetime],
    ) -> Callable[[], list[tuple[Any, ...]]]:
        """Lease the first ``limit`` rows due at ``now`` (those another claim holds passed
        over) in one statement (SQLite, ``supports_json_each``: a read of them and one
        statement): each gets ``token``, ``expires``, one more attempt and the deliver time of
        ``after_lease`` for its attempts so far (the last for more), or of ``old`` (sent
        before its first value: the second) for a message that old. Returns a function that
        returns the rows as ``select_due`` does, the deliver time and lease expiry they had,
        and their attempts before this claim, in no order: it converts them (the fields'
        converters, on this thread's connection), so call it after the commit, outside the
        write lock."""
        connection = connections[self.using]  # this thread's
        by_rowid = driver_of(connection).supports_json_each
        sql = self._written(("claim_due", len(after_lease), by_rowid), self._claim_due_sql)
        save_time = _preparer(self.fields["deliver_time"], connection, save=True)
        leased: list[Any] = [
            token,
            _preparer(self.fields["lease_expires_at"], connection, save=True)(expires),
            self._lookup(self.fields["deliver_time"], old[0], connection),
            save_time(old[1]),
        ]
        for attempts, due_again in after_lease[:-1]:
            leased.extend((attempts, save_time(due_again)))
        leased.append(save_time(after_lease[-1][1]))
        due_at = self._lookup(self.fields["deliver_time"], now, connection)
        with connection.cursor() as cursor:
            if not by_rowid:
                cursor.execute(sql, [due_at, limit, *leased])
                found = cursor.fetchall()
                return lambda: self._converted(found, connection)
            # SQLite: the due rows with their rowid (last), then one UPDATE of those rowids;
            # the transaction's write lock holds them between the two
            cursor.execute(self.due_rowid_sql(connection), [due_at, limit])
            found = cursor.fetchall()
            if found:
                rowids = json.dumps([row[-1] for row in found])
                cursor.execute(sql, [*leased, rowids])
        return lambda: [row[:-1] for row in self._converted(found, connection)]

    def due_rowid_sql(self, connection: Any) -> str:
        """``due_sql`` with each row's ``rowid`` after its columns (SQLite), the limit a
        parameter."""
        return self._written(("due_rowid",), lambda: self._due_rowid_sql(connection.ops))

    def _due_rowid_sql(self, ops: Any) -> str:
        columns = ", ".join(ops.quote_name(f.column) for f in self.due_columns)
        deliver = ops.quote_name(self.fields["deliver_time"].column)
        return (
            f"SELECT {columns}, rowid FROM {self.table} WHERE {self.due_where} "
            f"ORDER BY {deliver} ASC LIMIT %s"
        )

    def _written(self, key: tuple[Any, ...], write: Callable[..., str]) -> str:
        """The statement ``write(*key[1:])`` writes, written once per ``key`` (the same for
        every thread's connection to the database, as the other statements here)."""
        sql = self.written.get(key)
        if sql is None:
            sql = self.written[key] = write(*key[1:])
        return sql

    def _claim_due_sql(self, levels: int, by_rowid: bool) -> str:
        """``claim_due``'s statement for ``levels`` deliver times (the limit a parameter); with
        ``by_rowid``, SQLite's ``UPDATE`` of the rowids read (a JSON array, the last
        parameter)."""
        ops = connections[self.using].ops
        quote = ops.quote_name
        table, where_due = self.table, self.due_where
        keys = [quote(f.column) for f in self.key]
        rest = self.due_columns[len(self.key) :]
        column = {n: quote(f.column) for n, f in zip(self.DUE_COLUMNS, rest, strict=True)}
        token_col = quote(self.fields["lease_token"].column)
        deliver, expires_col = column["deliver_time"], column["lease_expires_at"]
        attempts_col, sent = column["attempts"], column["send_time"]
        whens = " ".join(f"WHEN {table}.{attempts_col} = %s THEN %s" for _ in range(levels - 1))
        if by_rowid:
            return (
                f"UPDATE {table} SET {token_col} = %s, {expires_col} = %s, "
                f"{attempts_col} = {table}.{attempts_col} + 1, "
                f"{deliver} = CASE WHEN {table}.{sent} <= %s THEN %s {whens} ELSE %s END "
                "WHERE rowid IN (SELECT value FROM json_each(%s))"
            )
        return (
            f"WITH picked AS (SELECT {', '.join(keys)}, {deliver} AS was_due, "
            f"{expires_col} AS had_lease FROM {table} WHERE {where_due} ORDER BY {deliver} ASC "
            f"LIMIT %s {ops.for_update_sql(skip_locked=True)}) "
            f"UPDATE {table} SET {token_col} = %s, {expires_col} = %s, "
            f"{attempts_col} = {table}.{attempts_col} + 1, "
            f"{deliver} = CASE WHEN {table}.{sent} <= %s THEN %s {whens} ELSE %s END "
            f"FROM picked WHERE "
            + " AND ".join(f"{table}.{k} = picked.{k}" for k in keys)
            + f" RETURNING {', '.join(f'{table}.{k}' for k in keys)}, {table}.{column['payload']}, "
            f"picked.was_due, {table}.{sent}, {table}.{attempts_col} - 1, picked.had_lease"
        )

    def _converted(self, found: list[Any], connection: Any) -> list[tuple[Any, ...]]:
        """Rows of the key columns then ``DUE_COLUMNS``, as the ORM's ``values_list`` returns
        them (the backend's and the fields' converters applied), except the lease expiry
        (the last), left as read: only whether it is set is ever asked (a claim's lease that
        ran out), and converting it was a sixth of building a claim's messages."""
        if not found:
            return []
        ops = connection.ops
        converters = []
        fast_datetime = driver_of(connection).datetime_reader()
        for i, f in enumerate(self.due_columns[:-1]):
            col = f.get_col(f.model._meta.db_table)
            funcs = ops.get_db_converters(col) + col.get_db_converters(connection)
            if fast_datetime is not None:
                slow = getattr(ops, "convert_datetimefield_value", None)
                funcs = [fast_datetime if func == slow else func for func in funcs]
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
        connection = connections[self.using]  # this thread's
        params = self._claim_params(claims, connection)
        with connection.cursor() as cursor:
            cursor.executemany(self.claim_sql, params)
            updated = cursor.rowcount
        if updated == len(claims):
            return [True] * len(claims)
        return [self.held_by(c.key) == [c.lease_token] for c in claims]

    def _claim_params(self, claims: Sequence[Claim], connection: Any) -> list[list[Any]]:
        """The parameters of ``claim_sql`` for each of ``claims``, in its order: the new lease
        token, lease expiry, attempts and deliver time, the key, and the deliver time read."""
        f = self.fields
        save_token = _preparer(f["lease_token"], connection, save=True)
        save_attempts = _preparer(f["attempts"], connection, save=True)
        key_of = self._key_preparer(connection)
        save_expires = _preparer(f["lease_expires_at"], connection, save=True)
        save_deliver = _preparer(f["deliver_time"], connection, save=True)
        look_due = _preparer(f["deliver_time"], connection)
        # Each time is adapted once per claim: one lease expiry and one new deliver time per
        # attempt number for all its rows, and often the same deliver time read (a send_many).
        adapted: dict[tuple[Any, datetime], Any] = {}

        def once(adapter: Any, value: datetime) -> Any:
            key = (adapter, value)
            if key not in adapted:
                adapted[key] = adapter(value)
            return adapted[key]

        return [
            [
                save_token(c.lease_token),
                once(save_expires, c.lease_expires_at),
                save_attempts(c.attempts),
                once(save_deliver, c.deliver_time),
                *key_of(c.key),
                once(look_due, c.was_due),
            ]
            for c in claims
        ]

    def held_by(self, key: Sequence[Any]) -> list[str | None]:
        """The lease token of the row under ``key`` (``[]``: no row), as a fetch."""
        connection = connections[self.using]
        with connection.cursor() as cursor:
            cursor.execute(self.token_sql, self._key(key, connection))
            return [row[0] for row in cursor.fetchall()]

    def delete_many(self, keys: Sequence[Sequence[Any]], lease_tokens: Sequence[str | None]) -> int:
        """``delete(key, token)`` for each pair in one ``executemany`` (the statement converted
        and sent once, each row deleted by its own compare-and-set on the token); the summed
        row count, so ``len(keys)`` (distinct keys) only if every row was deleted. A driver
        that does not sum counts reports less: the caller then takes its slow path."""
        connection = connections[self.using]  # this thread's
        key_of = self._key_preparer(connection)
        look_token = _preparer(self.fields["lease_token"], connection)
        params = [
            [*key_of(key), look_token(token)] for key, token in zip(keys, lease_tokens, strict=True)
        ]
        driver = driver_of(connection)
        if driver.supports_array_parameters:
            # one DELETE of the rows whose (key, token) is among the arrays' (unnest)
            columns = [list(column) for column in zip(*params, strict=True)]
            with connection.cursor() as cursor:
                cursor.execute(self._written(("delete_unnest",), self._delete_unnest_sql), columns)
                return cursor.rowcount
        if driver.supports_json_each and all(type(v) in _JSON_KEYS for row in params for v in row):
            # one DELETE of the rows whose (key, token) is among the JSON array's (SQLite)
            with connection.cursor() as cursor:
                sql = self._written(("delete_json",), self._delete_json_sql)
                cursor.execute(sql, [json.dumps(params)])
                return cursor.rowcount
        with connection.cursor() as cursor:
            cursor.executemany(self.delete_leased_sql, params)
            return cursor.rowcount

    def _delete_unnest_sql(self) -> str:
        """``DELETE ... WHERE (key..., token) IN (SELECT * FROM unnest(%s::type[], ...))``:
        one array parameter for each key column and the token (PostgreSQL)."""
        connection = connections[self.using]
        quote = connection.ops.quote_name
        fields = [*self.key, self.fields["lease_token"]]
        columns = ", ".join(quote(f.column) for f in fields)
        arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
        return f"DELETE FROM {self.table} WHERE ({columns}) IN (SELECT * FROM unnest({arrays}))"

    def _delete_json_sql(self) -> str:
        """``DELETE`` of the rows whose key and token are a ``[key..., token]`` of one JSON
        array (SQLite), each row found from its array entry by the key's index (a join:
        ``(key..., token) IN (SELECT json_extract(...) ...)`` searched by the first key column
        alone)."""
        quote = connections[self.using].ops.quote_name
        table = self.table
        fields = [*self.key, self.fields["lease_token"]]
        on = " AND ".join(
            f"{table}.{quote(f.column)} = json_extract(j.value, '$[{i}]')"
            for i, f in enumerate(fields)
        )
        return (
            f"DELETE FROM {table} WHERE rowid IN "
            f"(SELECT {table}.rowid FROM json_each(%s) AS j JOIN {table} ON {on})"
        )

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


#: the parameter types a JSON array carries as SQLite compares them (``delete_many``):
#: others (bytes, floats, decimals) go one statement a row
_JSON_KEYS = frozenset({int, str})

#: per (queue model, alias): the SQL is the same for every thread's connection
_cache: dict[tuple[type[Queue], str], RowStatements] = {}


def _binary_placeholder(field: BinaryField, connection: Any) -> str:
    """``field``'s placeholder for a bytes value: Django 6.1's ``get_placeholder_sql``
    (the backend's ``binary_placeholder_sql``), else Django 5.2/6.0's ``get_placeholder``
    (django-stubs 5.2.9 lacks both)."""
    if hasattr(field, "get_placeholder"):  # Django 5.2, 6.0
        return str(field.get_placeholder(b"", None, connection))
    sql, _params = connection.ops.binary_placeholder_sql(b"", None)  # Django 6.1
    return str(sql)


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
            _binary_placeholder(f, connection) if isinstance(f, BinaryField) else "%s"
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
    "lease_expires_at", "send_time", "dropped",
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
    _set(message, "dropped", False)
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
