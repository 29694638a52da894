"""The native engine: real Spanner queues (Enterprise and Enterprise Plus editions).

- Schema: ``CREATE QUEUE`` / ``DROP QUEUE`` (``spanner_queues.native.ddl``).
- Send: ``INSERT`` DML through the caller's Django connection and transaction (the outbox);
  ``send_mutations`` writes ``Send`` mutations for batches made outside the ORM.
- Receive: a background ``RECEIVE_<Q>`` stream per queue on a strong single-use snapshot,
  through google-cloud-spanner directly (``spanner_queues.native.receive``).
- Renew: one ``RENEWLEASE_<Q>`` call per queue for all tokens; tokens rotate.
- Ack: ``DELETE ... ASSERT_ROWS_MODIFIED 1`` in the caller's transaction (``OUT_OF_RANGE`` ->
  ``MessageAlreadyAcked``, the transaction is marked for rollback); ``ack_mutations`` for batches.

Settings (``SPANNER_QUEUES[alias]["OPTIONS"]``): ``DIALECT`` ("googlesql" | "postgresql"),
``RECEIVE_MAX_DURATION_SECONDS`` (1200), ``RECEIVE_BATCH_SIZE`` (10), ``RECEIVE_WAIT_SECONDS``
(1.0), ``RECEIVE_BUFFER_SIZE`` (100), ``LEASE_MARGIN_SECONDS`` (0.5).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections, transaction
from django.utils import timezone

from spanner_queues import failures
from spanner_queues.conf import EngineParams
from spanner_queues.drivers import driver_for
from spanner_queues.engines.base import BaseQueueEngine, EngineFeatures, QueueStats
from spanner_queues.exceptions import (
    InvalidMessage,
    InvalidQueueEngine,
    MessageAlreadyAcked,
    MessageAlreadyExists,
    NotSupportedByEngine,
    QueueConfigurationError,
)
from spanner_queues.keys import key_fields, key_filter, key_names
from spanner_queues.message import Message, OutgoingMessage
from spanner_queues.native import client
from spanner_queues.native.ddl import GOOGLESQL, QueueDeclaration, declare, dialect, duration
from spanner_queues.native.receive import Delivery, Receiver
from spanner_queues.options import queue_options

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions

logger = logging.getLogger("spanner_queues.native")

#: Spanner's lease: 10 s from delivery or renewal, not configurable.
NATIVE_LEASE = timedelta(seconds=10)

#: One RECEIVE stream per (engine alias, queue) and process, shared by every thread (engines
#: are per thread, like database connections; streams must not be).
_streams: dict[tuple[str, str], Receiver] = {}
_streams_lock = threading.Lock()


def stop_all_streams(wait: float | None = 5.0) -> None:
    """Stop every RECEIVE stream of this process (at exit, so none outlives the program)."""
    with _streams_lock:
        receivers = list(_streams.values())
        _streams.clear()
    for receiver in receivers:
        receiver.stop(wait)


atexit.register(stop_all_streams)


def _prep_key(model: type[Queue], key: Sequence[Any], connection: Any) -> list[Any]:
    """Key values as the ORM writes and filters them (``UUIDField`` -> 32-char hex,
    ``BinaryField`` -> base64 for the client): the same values for DML and mutations."""
    return [
        f.get_db_prep_value(v, connection, prepared=False)
        for f, v in zip(key_fields(model), key, strict=True)
    ]


def _key_from_row(model: type[Queue], values: Sequence[Any]) -> tuple[Any, ...]:
    """RECEIVE key columns back to Python values, as the ORM reads them."""
    out = []
    for f, v in zip(key_fields(model), values, strict=True):
        if v is not None and f.get_internal_type() == "BinaryField":
            v = client.decode_bytes(v)
        elif v is not None:
            v = f.to_python(v)
        out.append(v)
    return tuple(out)


def _number(options: Any, name: str, default: float, alias: str, *, minimum: float) -> float:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]['OPTIONS'][{name!r}] must be a number >= {minimum}, "
            f"not {value!r}."
        )
    return float(value)


class NativeQueueEngine(BaseQueueEngine):
    """Spanner queues proper. Needs a real Spanner database of an Enterprise edition."""

    features = EngineFeatures(
        supports_native_queues=True,
        supports_lease_renewal=True,
        supports_release=False,
        supports_custom_lease=False,
        supports_attempt_count=False,
        supports_listing=True,
        rotates_lease_tokens=True,
        stores_bookkeeping_fields=False,
    )

    accepted_options = frozenset(
        {
            "DIALECT",
            "RECEIVE_MAX_DURATION_SECONDS",
            "RECEIVE_BATCH_SIZE",
            "RECEIVE_WAIT_SECONDS",
            "RECEIVE_BUFFER_SIZE",
            "LEASE_MARGIN_SECONDS",
        }
    )

    def __init__(self, params: EngineParams) -> None:
        super().__init__(params)
        options, alias = params.options, params.alias
        self.dialect = dialect(options.get("DIALECT", GOOGLESQL))
        #: the same dialect with ``%s`` placeholders, for statements run by a Django cursor.
        self.cursor_dialect = dialect(self.dialect.name, paramstyle="format")
        self.max_duration_seconds = _number(
            options, "RECEIVE_MAX_DURATION_SECONDS", 1200, alias, minimum=0.001
        )
        self.max_duration = duration(self.max_duration_seconds)
        batch = options.get("RECEIVE_BATCH_SIZE", 10)
        if batch is not None and (not isinstance(batch, int) or batch < 1):
            raise InvalidQueueEngine(
                f"SPANNER_QUEUES[{alias!r}]['OPTIONS']['RECEIVE_BATCH_SIZE'] must be an int "
                ">= 1 or None (Spanner's default)."
            )
        self.batch_size: int | None = batch
        self.receive_wait = _number(options, "RECEIVE_WAIT_SECONDS", 1.0, alias, minimum=0)
        self.buffer_size = int(_number(options, "RECEIVE_BUFFER_SIZE", 100, alias, minimum=1))
        self.lease_margin = timedelta(
            seconds=_number(options, "LEASE_MARGIN_SECONDS", 0.5, alias, minimum=0)
        )
        self._declarations: dict[type, QueueDeclaration] = {}

    # --- helpers -------------------------------------------------------------------------
    def declaration(self, model: type[Queue]) -> QueueDeclaration:
        decl = self._declarations.get(model)
        if decl is None:
            decl = self._declarations[model] = declare(model, queue_options(model))
        return decl

    def _spanner(self) -> Any:
        return client.database_for(self.database)

    def _require_googlesql(self, verb: str) -> None:
        if self.dialect.name != GOOGLESQL:
            raise NotSupportedByEngine(
                f"{verb} runs through django_spanner, which speaks GoogleSQL only; the "
                "PostgreSQL dialect is generated as DDL and SQL text (see sqlmigrate)."
            )

    # --- schema ---------------------------------------------------------------------------
    def create_queue(
        self,
        schema_editor: BaseDatabaseSchemaEditor,
        model: type[Queue],
        options: QueueOptions,
    ) -> None:
        self._refuse_unsupported_database(schema_editor)
        schema_editor.execute(self.dialect.create_queue(declare(model, options)), None)

    def drop_queue(
        self,
        schema_editor: BaseDatabaseSchemaEditor,
        model: type[Queue],
        options: QueueOptions,
    ) -> None:
        self._refuse_unsupported_database(schema_editor)
        self.stop_receiving(model)
        schema_editor.execute(self.dialect.drop_queue(declare(model, options)), None)

    def _refuse_unsupported_database(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.collect_sql:  # sqlmigrate: just print the statements
            return
        driver = driver_for(schema_editor.connection.alias)
        if not driver.supports_native_queues:
            raise QueueConfigurationError(driver.no_native_queues_reason)

    # --- sending --------------------------------------------------------------------------
    def send_many(
        self, model: type[Queue], messages: Sequence[OutgoingMessage], *, using: str
    ) -> list[Message]:
        self._require_googlesql("Sending with DML")
        decl = self.declaration(model)
        names = key_names(model)
        now = timezone.now()
        # A deliver time that is missing or already past means "now": DeliverTime is omitted
        # and Spanner delivers at once (it replaces past times "with a value closer to now").
        later = [m for m in messages if m.deliver_time is not None and m.deliver_time > now]
        at_once = [m for m in messages if m not in later]
        statements = []
        conn = connections[using]
        for group, timed in ((at_once, False), (later, True)):
            if not group:
                continue
            params: list[Any] = []
            for m in group:
                params.extend(_prep_key(model, [m.key[n] for n in names], conn))
                params.append(client.wire_payload(decl.payload_type, m.payload))
                if timed:
                    params.append(m.deliver_time)
            statements.append(
                (self.cursor_dialect.insert(decl, len(group), with_deliver_time=timed), params)
            )
        try:
            # One transaction for all statements (immediate and delayed messages are two
            # INSERTs): all or nothing even outside the caller's ``atomic``.
            with transaction.atomic(using=using), conn.cursor() as cursor:
                for sql, params in statements:
                    cursor.execute(sql, params)
        except Exception as exc:
            keys = ", ".join(str(tuple(m.key.values())) for m in messages)
            if client.grpc_status(exc) == "ALREADY_EXISTS":
                raise MessageAlreadyExists(
                    f"{model._meta.label}: a message with key {keys} already exists "
                    "(keys are identity; ack it first or use replace())."
                ) from exc
            if driver_for(using).is_missing_parent(exc):
                raise InvalidMessage(
                    f"{model._meta.label}: no parent row for key {keys} (the queue is "
                    "interleaved in its parent; create the parent first)."
                ) from exc
            raise
        return [
            Message(
                queue=model._meta.label,
                key=tuple(m.key[n] for n in names),
                key_names=names,
                payload=m.payload,
                deliver_time=m.deliver_time if m in later else now,
                send_time=now,
            )
            for m in messages
        ]

    def send_mutations(self, model: type[Queue], messages: Sequence[OutgoingMessage]) -> Any:
        """Send with ``Send`` mutations in one batch commit, outside any Django transaction.
        Returns the commit timestamp."""
        decl = self.declaration(model)
        names = key_names(model)
        connection = connections[self.database]
        try:
            return client.commit_mutations(
                self._spanner(),
                sends=[
                    (
                        decl.name,
                        tuple(_prep_key(model, [m.key[n] for n in names], connection)),
                        client.wire_payload(decl.payload_type, m.payload),
                        m.deliver_time,
                    )
                    for m in messages
                ],
            )
        except Exception as exc:
            if client.grpc_status(exc) == "ALREADY_EXISTS":
                raise MessageAlreadyExists(
                    f"{model._meta.label}: a message with one of the keys "
                    f"{[tuple(m.key.values()) for m in messages]!r} already exists; nothing "
                    "was sent."
                ) from exc
            raise

    # --- receiving ------------------------------------------------------------------------
    def receive_sql(self, model: type[Queue], max_batch_size: int | None = None) -> str:
        return self.dialect.receive(
            self.declaration(model),
            max_batch_size=max_batch_size or self.batch_size,
            max_duration=self.max_duration,
        )

    def _receiver(self, model: type[Queue], want: int = 1) -> Receiver:
        label = model._meta.label
        stream_key = (self.alias, label)
        with _streams_lock:
            receiver = _streams.get(stream_key)
            if receiver is not None and receiver.fatal is not None:
                # A permanent error stopped it (``take`` raised it): start afresh, the queue
                # may have been created or the permission granted since.
                del _streams[stream_key]
                receiver = None
            if receiver is None:
                database = self._spanner()
                n = len(self.declaration(model).keys)
                payload_type = self.declaration(model).payload_type

                deadline = self.max_duration_seconds + 30  # the call's own gRPC deadline

                current: dict[str, Any] = {}

                def open_stream(max_batch_size: int) -> Any:
                    sql = self.receive_sql(model, max_batch_size)
                    with database.snapshot() as snapshot:  # a pooled session, as the client
                        call = client.receive_stream(database, snapshot._session, sql, deadline)
                        current["call"] = call
                        try:
                            yield from client.rows_of(call)
                        finally:
                            current.pop("call", None)

                def cancel() -> None:
                    call = current.get("call")
                    if call is not None:
                        call.cancel()

                def parse(row: Sequence[Any]) -> Delivery:
                    return Delivery(
                        key=_key_from_row(model, row[:n]),
                        payload=client.payload_from_wire(payload_type, row[n]),
                        deliver_time=row[n + 1],
                        lease_token=row[n + 2],
                        lease_expires_at=row[n + 3],
                        last_in_batch=bool(row[n + 4]),
                    )

                def renew(tokens: list[str]) -> dict[str, tuple[str | None, Any]]:
                    return self._renew_tokens(model, tokens, database)

                receiver = _streams[stream_key] = Receiver(
                    label,
                    open_stream,
                    parse,
                    buffer_size=self.buffer_size,
                    lease_margin=self.lease_margin,
                    cancel=cancel,
                    renew=renew,
                    batch_size=self.batch_size,
                    stall_seconds=NATIVE_LEASE.total_seconds() / 2,
                )
            receiver.want(want)
            receiver.start()
            return receiver

    def receive(
        self, model: type[Queue], *, max_messages: int = 1, lease: timedelta | None = None
    ) -> list[Message]:
        # ``lease`` cannot be honoured: Spanner leases for 10 s and renews by 10 s.
        names = key_names(model)
        taken = self._receiver(model, max_messages).take(max_messages, self.receive_wait)
        failed: dict[tuple, int] = {}
        if taken and queue_options(model).max_attempts:
            # Spanner keeps no delivery count: attempts are the failed runs workers recorded.
            failed = failures.failures_of(
                model._meta.label, [d.key for d in taken], using=self.database
            )
        return [
            Message(
                queue=model._meta.label,
                key=d.key,
                key_names=names,
                payload=d.payload,
                deliver_time=d.deliver_time,
                attempt=failed.get(d.key, 0) + 1,
                lease_token=d.lease_token,
                lease_expires_at=d.lease_expires_at,
            )
            for d in taken
        ]

    def record_failure(
        self, model: type[Queue], message: Message, error: BaseException | None, *, using: str
    ) -> int:
        """Spanner counts no deliveries: for a queue with ``max_attempts`` the failed run
        goes to the failure ledger (``spanner_queues.failures``) in the caller's transaction;
        other queues keep no count."""
        if not queue_options(model).max_attempts:
            return message.attempt
        return failures.record_failure(message, error, using=using)

    def clear_failures(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> None:
        if keys:
            failures.clear_failures(model._meta.label, keys, using=using)

    def stop_receiving(
        self, model: type[Queue] | None = None, *, wait: float | None = None
    ) -> None:
        """Stop this process's RECEIVE stream of ``model`` (of every queue of this alias when
        None): the stream is shared by every thread; leased rows not yet taken are dropped
        (Spanner delivers them again after their lease). ``wait`` seconds for each to end."""
        with _streams_lock:
            keys = [
                k for k in _streams
                if k[0] == self.alias and (model is None or k[1] == model._meta.label)
            ]
            receivers = [_streams.pop(k) for k in keys]
        for receiver in receivers:
            receiver.stop(wait)

    def renew_sql(self, model: type[Queue], count: int = 1) -> str:
        return self.dialect.renew(self.declaration(model), count)

    def _renew_tokens(
        self, model: type[Queue], tokens: list[str], database: Any = None
    ) -> dict[str, tuple[str | None, Any]]:
        """One ``RENEWLEASE_<Q>`` for ``tokens``: old token -> (new token, new expiry)."""
        return client.renew(
            database or self._spanner(),
            self.renew_sql(model, len(tokens)),
            self.dialect.renew_params(tokens),
        )

    def renew_leases(self, model: type[Queue], messages: Sequence[Message]) -> list[Message]:
        """One ``RENEWLEASE_<Q>`` call for ``messages`` and, together with them, the rows this
        process's stream holds for the queue that are due for renewal."""
        with _streams_lock:
            receiver = _streams.get((self.alias, model._meta.label))
        held = receiver.held_tokens_due() if receiver is not None else []
        tokens = list(dict.fromkeys([m.lease_token for m in messages if m.lease_token] + held))
        if not tokens:
            return []
        renewed = self._renew_tokens(model, tokens)
        if held and receiver is not None:
            receiver.apply_renewals(renewed, held)
        result = []
        for message in messages:
            new_token, expires = renewed.get(message.lease_token or "", (None, None))
            if new_token:  # no row, or a NULL new token: the lease is lost
                result.append(replace(message, lease_token=new_token, lease_expires_at=expires))
        return result

    # --- acking ---------------------------------------------------------------------------
    def ack_many(self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str) -> None:
        self._require_googlesql("Acking with DML")
        sql = self.cursor_dialect.ack(self.declaration(model))
        # One statement per key, all in one transaction (the caller's, when there is one).
        conn = connections[using]
        with transaction.atomic(using=using), conn.cursor() as cursor:
            for key in keys:
                try:
                    cursor.execute(sql, _prep_key(model, key, conn))
                except Exception as exc:
                    if client.grpc_status(exc) != "OUT_OF_RANGE":
                        raise
                    # Statement-level on Spanner: the transaction would still commit the
                    # caller's other writes. Never continue it: mark it for rollback.
                    transaction.set_rollback(True, using=using)
                    raise MessageAlreadyAcked(
                        f"{model._meta.label}{tuple(key)!r}: no such message; it was already "
                        "acked (or deleted). Roll back: the work may have been done by "
                        "another receiver."
                    ) from exc

    def discard(self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str) -> None:
        from spanner_queues.models import rows

        for key in keys:
            rows(model, using).filter(key_filter(model, key)).delete()

    def ack_mutations(
        self,
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        *,
        ignore_not_found: bool = False,
    ) -> Any:
        """Ack with ``Ack`` mutations in one batch commit, outside any Django transaction.
        ``NOT_FOUND`` (a missing message) raises ``MessageAlreadyAcked`` and nothing is acked,
        unless ``ignore_not_found``. Returns the commit timestamp."""
        name = self.declaration(model).name
        connection = connections[self.database]
        try:
            return client.commit_mutations(
                self._spanner(),
                acks=[
                    (name, tuple(_prep_key(model, k, connection)), ignore_not_found or None)
                    for k in keys
                ],
            )
        except Exception as exc:
            if client.grpc_status(exc) == "NOT_FOUND":
                raise MessageAlreadyAcked(
                    f"{model._meta.label}: Ack found no message for one of {list(keys)!r}; "
                    "nothing was acked."
                ) from exc
            raise

    def purge(self, model: type[Queue], *, using: str | None = None) -> None:
        """Delete every message of the queue (tests, maintenance)."""
        self._require_googlesql("Purging with DML")
        with connections[using or self.database].cursor() as cursor:
            cursor.execute(self.cursor_dialect.purge(self.declaration(model)))

    # --- observing ------------------------------------------------------------------------
    def stats(self, model: type[Queue]) -> QueueStats:
        """Counts by ``DeliverTime`` only: Spanner does not expose leases, so in-flight
        messages count as ``ready`` and ``leased`` is always 0."""
        now = timezone.now()
        with self._spanner().snapshot() as snapshot:
            [(total, due, oldest)] = list(
                snapshot.execute_sql(self.dialect.stats(self.declaration(model)))
            )
        total, due = int(total or 0), int(due or 0)
        return QueueStats(
            queue=model._meta.label,
            total=total,
            ready=due,
            scheduled=total - due,
            leased=0,
            oldest_send_time=oldest if isinstance(oldest, datetime) else None,
            max_attempts=None,
            measured_at=now,
        )

    def check(self) -> list[checks.CheckMessage]:
        driver = driver_for(self.database)
        if driver.supports_native_queues:
            return []
        return [
            checks.Error(
                f"SPANNER_QUEUES[{self.alias!r}] uses the native engine, but database "
                f"{self.database!r} cannot hold Spanner queues: {driver.no_native_queues_reason}",
                hint="Use 'ENGINE': 'table' for this database (SQLite, PostgreSQL, the Spanner "
                "emulator), and 'native' only for a real Spanner database of the Enterprise or "
                "Enterprise Plus edition.",
                id="spanner_queues.E007",
            )
        ]
