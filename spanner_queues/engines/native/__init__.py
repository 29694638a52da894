"""The native engine: real Spanner queues (Enterprise and Enterprise Plus editions).

- Schema: ``CREATE QUEUE`` / ``DROP QUEUE`` (the text: ``ddl``).
- Send: ``INSERT`` DML through the caller's Django connection and transaction (the outbox), one
  statement per 950 query parameters; ``send_mutations`` writes ``Send`` mutations for batches
  made outside the ORM, in a read-write transaction of their own (safe to retry).
- Receive: a background ``RECEIVE_<Q>`` stream per queue and process on a strong single-use
  snapshot, through google-cloud-spanner directly (``receive.ReceiveStream`` runs one; this module
  keeps them). One stream per (alias, queue), shared by every thread (engines are per thread,
  like database connections; streams must not be). A stream stopped by a permanent error is
  started afresh by the next receive (the queue may have been created, or the permission
  granted, since); every stream is stopped at exit, so none outlives the program. A demand is
  first asked in a probe (``PROBE_MAX_DURATION_SECONDS``: one batch, no cancel);
  ``settle_receiving`` makes a stream's calls brief (``BRIEF_MAX_DURATION_SECONDS``) until it
  is stopped.
- Renew: one ``RENEWLEASE_<Q>`` call per queue and 950 tokens, renewing with the in-flight
  messages the rows the stream holds that are due for renewal; tokens rotate. Sent once, never
  retried: when its answer is lost the leases may have been renewed under tokens nobody holds,
  so those tokens are kept as they are, with their old expiry, and never sent again
  (``_unsettled``): a run that ends before that expiry acks as usual (by key), and at worst
  the lease runs out at its old expiry.
- Ack: ``DELETE ... ASSERT_ROWS_MODIFIED n`` in the caller's transaction, one statement for a
  batch (``OUT_OF_RANGE`` -> ``MessageAlreadyAcked``, the transaction is marked for rollback);
  ``ack_mutations`` for batches outside it.
- Table listings: a new connection to the database has its introspection wrapped so that
  queues are not tables to ``flush`` and ``inspectdb`` (``connection_created``).

Settings (``SPANNER_QUEUES[alias]["OPTIONS"]``): ``DIALECT`` ("googlesql" | "postgresql"),
``RECEIVE_MAX_DURATION_SECONDS`` (1200), ``RECEIVE_BATCH_SIZE`` (10), ``RECEIVE_WAIT_SECONDS``
(1.0), ``RECEIVE_BUFFER_SIZE`` (100), ``LEASE_MARGIN_SECONDS`` (0.5).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import json
import logging
import operator
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections, transaction
from django.db.backends.base.introspection import TableInfo
from google.api_core import exceptions as gexc

from spanner_queues import clock, failures, ordering
from spanner_queues.conf import EngineParams
from spanner_queues.drivers import driver_for, grpc_status
from spanner_queues.engines.base import BaseQueueEngine, EngineFeatures, QueueStats
from spanner_queues.engines.native import client
from spanner_queues.engines.native.receive import LeasedRow, Probes, ReceiveStream
from spanner_queues.engines.spanner_ddl import (
    GOOGLESQL,
    MAX_QUERY_PARAMETERS,
    QueueDeclaration,
    declare,
    dialect,
    duration,
)
from spanner_queues.exceptions import (
    InvalidMessage,
    InvalidQueueEngine,
    MessageAlreadyAcked,
    MessageAlreadyExists,
    NotSupportedByEngine,
    QueueConfigurationError,
    QueueUnavailable,
)
from spanner_queues.keys import key_fields, key_filter, key_names
from spanner_queues.message import AttemptLoader, Message, OutgoingMessage
from spanner_queues.options import ordered_by, queue_options
from spanner_queues.semantics import LEASE
from spanner_queues.storage import rows

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions

logger = logging.getLogger("spanner_queues.engines.native")

#: ``max_duration`` of a probe (``ReceiveStream``): a call that ends by itself after one batch.
PROBE_MAX_DURATION_SECONDS = 0.001

#: ``max_duration`` of a settled stream's calls (at most ``RECEIVE_MAX_DURATION_SECONDS``): a
#: caller that stops once nothing is due waits for the open call to end, so it is short.
BRIEF_MAX_DURATION_SECONDS = 2.0

#: this process's streams by (engine alias, queue label)
_streams: dict[tuple[str, str], ReceiveStream] = {}
#: streams whose calls are brief (``settle_receiving``), until stopped.
_brief: set[tuple[str, str]] = set()
#: what each database (engine alias) answered to the streams' probes, shared by its streams
_probes: dict[str, Probes] = {}
_streams_lock = threading.Lock()
#: lease tokens whose ``RENEWLEASE`` answer was lost, by when (monotonic) they are forgotten
#: (their old expiry has passed by then): never sent again (``renew_tokens``)
_unsettled: dict[str, float] = {}
_unsettled_lock = threading.Lock()

#: when (monotonic) this process last sent to a queue, by (alias, label): a stream's call open
#: since before it has not been shown that message yet, so a take waits its full wait for it
_last_sent: dict[tuple[str, str], float] = {}

#: how often (seconds) a failure's transaction may also prune the ledger of its queue, and the
#: age and number of records one prune looks at (``failures.prune``): a failing message is
#: delivered again within ``failures.REDELIVERY_BOUND`` of its last failed run.
PRUNE_INTERVAL_SECONDS = 3600.0
PRUNE_AGE = failures.REDELIVERY_BOUND
PRUNE_BATCH = 100

#: the tripwire on ``DeliverTime``, which Google does not say whether a lease moves: queues, by
#: (alias, label), of which this process saw a delivery whose ``DeliverTime`` was later than its
#: lease's start (``failures.moved_deliver_time``), and how many such deliveries. Such a queue's
#: failure ledger takes every record to be its key's (``failures.belongs``), and no delivery of
#: it is taken for a first one (``failures.first_delivery``).
_moved: set[tuple[str, str]] = set()
_moves: collections.Counter[tuple[str, str]] = collections.Counter()
_moved_lock = threading.Lock()


def deliver_time_moved(engine: BaseQueueEngine, model: type[Queue]) -> bool:
    """Whether this process saw Spanner move the ``DeliverTime`` of a message of ``model`` on
    ``engine``'s alias (the queue's failure ledger then fails closed)."""
    return (engine.alias, model._meta.label) in _moved


def forget_moved_deliver_times() -> None:
    """Forget what the tripwire saw (tests that play one answer after another)."""
    with _moved_lock:
        _moved.clear()
        _moves.clear()


def _trip(alias: str, label: str, seen: Sequence[LeasedRow]) -> bool:
    """Count the deliveries of ``seen`` whose ``DeliverTime`` is later than their lease's start;
    on the first of a queue, log an ERROR and switch its ledger to the fail-closed rule. Returns
    whether the queue's ``DeliverTime`` is known to move."""
    key = (alias, label)
    moved = [d for d in seen if failures.moved_deliver_time(d.deliver_time, d.lease_expires_at)]
    if not moved:
        return key in _moved
    with _moved_lock:
        first = key not in _moved
        _moved.add(key)
        _moves[key] += len(moved)
    if first:
        d = moved[0]
        logger.error(
            "%s: a delivery showed DeliverTime %s, later than its lease's start %s: Spanner "
            "moves DeliverTime on a lease, which Google does not document. The failure ledger "
            "of this queue now takes every record to be its key's (a failing message is still "
            "given up at max_attempts; a message sent again under the key of one deleted where "
            "nothing of ours ran inherits its failures). Please report it.",
            label,
            d.deliver_time,
            d.lease_expires_at - LEASE if d.lease_expires_at is not None else None,
        )
    return True


class FirstDeliveries:
    """Lease tokens this process handed out for first deliveries (``failures.first_delivery``)
    that have no failed run recorded: their ack has no failure record to delete, so it writes
    nothing to the ledger. A token leaves with its ack, its failure, or its renewal (the new
    token takes its place); one whose lease ran out leaves at the next ``add`` after one lease,
    so the set holds at most the leases live now and those of the last lease length."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, datetime] = {}  # token -> lease expiry (Spanner's clock)
        self._swept = time.monotonic()

    def add(self, messages: Sequence[Message]) -> None:
        with self._lock:
            for m in messages:
                expires = m.lease_expires_at
                if m.lease_token and expires and failures.first_delivery(m.deliver_time, expires):
                    self._tokens[m.lease_token] = expires
            if time.monotonic() - self._swept > LEASE.total_seconds():
                self._swept = time.monotonic()
                gone = clock.now() - LEASE  # (a lease's length of margin for the clocks)
                for token in [t for t, e in self._tokens.items() if e < gone]:
                    del self._tokens[token]

    def discard(self, tokens: Sequence[str | None]) -> None:
        with self._lock:
            for token in tokens:
                if token:
                    self._tokens.pop(token, None)

    def renewed(self, renewals: dict[str, tuple[str | None, Any]]) -> None:
        """Carry each renewed first delivery to its new token."""
        with self._lock:
            for old, (new, expires) in renewals.items():
                if self._tokens.pop(old, None) is not None and new and expires is not None:
                    self._tokens[new] = expires

    def take(self, tokens: Sequence[str | None]) -> list[bool]:
        """For each token: whether it is a first delivery without a failure on record; every
        token leaves the set (acked)."""
        with self._lock:
            return [t is not None and self._tokens.pop(t, None) is not None for t in tokens]

    def __len__(self) -> int:
        return len(self._tokens)


#: this process's first deliveries, every alias and queue (tokens are unique).
_first_deliveries = FirstDeliveries()
#: when (monotonic) a failure last pruned the ledger of a queue, by (alias, label)
_pruned: dict[tuple[str, str], float] = {}
#: queues whose failure ledger is due a prune, and the database: the queue's next ``receive``
#: outside a transaction runs it, in a transaction of its own (``record_failure``)
_prune_due: dict[tuple[str, str], str] = {}
#: where the next prune of a queue's ledger goes on from (the last record it looked at, by
#: ``updated_at``), by (alias, label): each prune looks at the next records, not the same oldest
#: ones again (records of queued messages would stall it); back to the start after the last
_prune_from: dict[tuple[str, str], datetime] = {}


def stop_all_streams(wait: float | None = 5.0) -> None:
    """Stop every RECEIVE stream of this process (at exit, so none outlives the program)."""
    with _streams_lock:
        streams = list(_streams.values())
        _streams.clear()
        _brief.clear()
        _probes.clear()
    for stream in streams:
        stream.stop(wait)


atexit.register(stop_all_streams)

#: the table type Django's listings skip (they take "t", and "v" only when asked for views)
QUEUE = "q"
_OTHER_TYPES_SQL = (
    "SELECT t.table_name FROM information_schema.tables AS t "
    "WHERE t.table_catalog = '' AND t.table_schema = '' "
    "AND t.table_type NOT IN ('BASE TABLE', 'VIEW')"
)


def _number(options: Any, name: str, default: float, alias: str, *, minimum: float) -> float:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]['OPTIONS'][{name!r}] must be a number >= {minimum}, "
            f"not {value!r}."
        )
    return float(value)


def _row_parser(
    model: type[Queue], n: int, payload_type: str
) -> Callable[[Sequence[Any]], LeasedRow]:
    """The ``LeasedRow`` of a ``RECEIVE_<Q>`` row of ``model`` (``n`` key columns, then the
    payload, deliver time, lease token, lease's end and ``SpannerLastBatchMessage``)."""

    def parse(row: Sequence[Any]) -> LeasedRow:
        return LeasedRow(
            key=client.key_from_row(model, row[:n]),
            payload=client.payload_from_wire(payload_type, row[n]),
            deliver_time=row[n + 1],
            lease_token=row[n + 2],
            lease_expires_at=row[n + 3],
            last_in_batch=bool(row[n + 4]),
        )

    return parse


def _keys_text(messages: Sequence[OutgoingMessage]) -> str:
    keys = ", ".join(str(tuple(m.key.values())) for m in messages[:20])
    if len(messages) > 20:
        keys += f" (and {len(messages) - 20} more)"
    return keys


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
        #: ``max_duration`` of a settled stream's calls
        self.brief_seconds = min(BRIEF_MAX_DURATION_SECONDS, self.max_duration_seconds)
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

    def spanner(self) -> Any:
        """The google-cloud-spanner ``Database`` behind this engine's database alias."""
        return client.database_for(self.database)

    def _require_googlesql(self, verb: str) -> None:
        if self.dialect.name != GOOGLESQL:
            raise NotSupportedByEngine(
                f"{verb} runs through django_spanner, which speaks GoogleSQL only; the "
                "PostgreSQL dialect is generated as DDL and SQL text (see sqlmigrate)."
            )

    @staticmethod
    def _no_queues_reason(alias: str) -> str | None:
        """Why database ``alias`` cannot hold Spanner queues (None: it can). Google's emulator
        cannot parse CREATE QUEUE (cloud-spanner-emulator issue #383); the queue-aware front
        of ``python -m spanner_queues_emulator`` can, and says so."""
        driver = driver_for(alias)
        if not driver.supports_native_queues:
            return driver.no_native_queues_reason
        host = os.environ.get("SPANNER_EMULATOR_HOST")
        if host and not client.emulator_has_queues(host):
            return (
                f"it is Google's Cloud Spanner emulator (SPANNER_EMULATOR_HOST={host}), which "
                "cannot parse CREATE QUEUE or run RECEIVE_<queue> (cloud-spanner-emulator issue "
                "#383); run `python -m spanner_queues_emulator` for an emulator with queues."
            )
        return None

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
        reason = self._no_queues_reason(schema_editor.connection.alias)
        if reason is not None:
            raise QueueConfigurationError(reason)

    # --- sending --------------------------------------------------------------------------
    def send_many(
        self, model: type[Queue], messages: Sequence[OutgoingMessage], *, using: str
    ) -> list[Message]:
        """``INSERT`` the messages in one transaction (the caller's, when there is one): one
        statement per ``MAX_QUERY_PARAMETERS`` parameters, so any number of messages fits in
        one transaction (up to Spanner's commit limits)."""
        self._require_googlesql("Sending with DML")
        _last_sent[(self.alias, model._meta.label)] = time.monotonic()
        decl = self.declaration(model)
        names = key_names(model)
        now = clock.now()
        # A deliver time that is missing or already past means "now": DeliverTime is omitted
        # and Spanner delivers at once (it replaces past times "with a value closer to now").
        later = [m for m in messages if m.deliver_time is not None and m.deliver_time > now]
        timed_ids = {id(m) for m in later}
        at_once = [m for m in messages if id(m) not in timed_ids]
        statements = []
        conn = connections[using]
        for group, timed in ((at_once, False), (later, True)):
            if not group:
                continue
            width = self.cursor_dialect.insert_width(decl, with_deliver_time=timed)
            for chunk in client.chunks(group, MAX_QUERY_PARAMETERS // width):
                params: list[Any] = []
                for m in chunk:
                    params.extend(client.prep_key(model, [m.key[n] for n in names], conn))
                    params.append(client.wire_payload(decl.payload_type, m.payload))
                    if timed:
                        params.append(m.deliver_time)
                sql = self.cursor_dialect.insert(decl, len(chunk), with_deliver_time=timed)
                statements.append((sql, params))
        sent = [now] * len(messages)
        try:
            # One transaction for all statements (immediate and delayed messages, and each
            # chunk, are INSERTs of their own): all or nothing even outside the caller's
            # ``atomic``.
            with transaction.atomic(using=using), conn.cursor() as cursor:
                if ordered_by(model):  # each message's place in its key (``ordering``)
                    sent = ordering.send_times(model, messages, now, using=using)
                    ordering.record_places(model, messages, sent, using=using)
                for sql, params in statements:
                    cursor.execute(sql, params)
        except Exception as exc:
            self._raise_send_error(model, messages, exc, using)
            raise
        return [
            Message(
                queue=model._meta.label,
                key=tuple(m.key[n] for n in names),
                key_names=names,
                payload=m.payload,
                deliver_time=m.deliver_time if id(m) in timed_ids else now,
                send_time=at,
            )
            for m, at in zip(messages, sent, strict=True)
        ]

    def send_mutations(self, model: type[Queue], messages: Sequence[OutgoingMessage]) -> Any:
        """Send with ``Send`` mutations committed together in a read-write transaction of
        their own, outside any Django transaction (``client.commit_mutations``: safe to retry):
        ``MessageAlreadyExists`` and nothing sent if a key is taken; ``CommitOutcomeUnknown``
        when the commit's answer is lost. Returns the commit timestamp."""
        _last_sent[(self.alias, model._meta.label)] = time.monotonic()
        decl = self.declaration(model)
        names = key_names(model)
        connection = connections[self.database]
        try:
            return client.commit_mutations(
                self.spanner(),
                sends=[
                    (
                        decl.name,
                        tuple(client.prep_key(model, [m.key[n] for n in names], connection)),
                        client.wire_payload(decl.payload_type, m.payload),
                        m.deliver_time,
                    )
                    for m in messages
                ],
            )
        except Exception as exc:
            self._raise_send_error(model, messages, exc, self.database)
            raise

    def _raise_send_error(
        self, model: type[Queue], messages: Sequence[OutgoingMessage], exc: Exception, using: str
    ) -> None:
        """Raise the ``QueueError`` a failed send means, if any (nothing was sent)."""
        if grpc_status(exc) == "ALREADY_EXISTS":
            raise MessageAlreadyExists(
                f"{model._meta.label}: {self._existing_text(model, messages)} (keys are "
                "identity; ack it first or use replace()); nothing was sent."
            ) from exc
        if driver_for(using).is_missing_parent(exc):
            raise InvalidMessage(
                f"{model._meta.label}: no parent row for key {_keys_text(messages)} (the queue "
                "is interleaved in its parent; create the parent first); nothing was sent."
            ) from exc

    def _existing_text(self, model: type[Queue], messages: Sequence[OutgoingMessage]) -> str:
        """Which keys of ``messages`` exist ("a message with key (...) exists"), read in a
        strong read of its own (the send's transaction failed); where the read fails, the
        keys of the batch ("one of the keys ... exists")."""
        if len(messages) > 1:
            try:
                found = self.existing_keys(model, messages)
            except Exception:
                found = []
            if found:
                shown = ", ".join(str(k) for k in found[:20])
                return f"a message with key {shown} already exists"
            return f"a message with one of the keys {_keys_text(messages)} already exists"
        return f"a message with key {_keys_text(messages)} already exists"

    def existing_keys(
        self, model: type[Queue], messages: Sequence[OutgoingMessage]
    ) -> list[tuple[Any, ...]]:
        """The keys of ``messages`` that are taken now (strong reads of the queue by key,
        one per ``MAX_QUERY_PARAMETERS`` key values, outside any transaction: a failed send's
        error names them)."""
        decl = self.declaration(model)
        names = key_names(model)
        connection = connections[self.database]
        columns = ", ".join(self.dialect.quote(c.column) for c in decl.keys)
        wire = [
            tuple(client.prep_key(model, [m.key[n] for n in names], connection)) for m in messages
        ]
        found: set[tuple[Any, ...]] = set()
        unique = list(dict.fromkeys(wire))
        for chunk in client.chunks(unique, MAX_QUERY_PARAMETERS // len(names)):
            params: dict[str, Any] = {}
            terms = []
            for i, values in enumerate(chunk):
                parts = []
                for j, (column, value) in enumerate(zip(decl.keys, values, strict=True)):
                    params[f"k{i}_{j}"] = value
                    parts.append(f"{self.dialect.quote(column.column)} = @k{i}_{j}")
                terms.append("(" + " AND ".join(parts) + ")")
            table = self.dialect.quote(decl.name)
            sql = f"SELECT {columns} FROM {table} WHERE {' OR '.join(terms)}"
            found.update(tuple(row) for row in client.query(self.spanner(), sql, params))
        return [
            tuple(m.key[n] for n in names)
            for m, values in zip(messages, wire, strict=True)
            if values in found
        ]

    # --- receiving ------------------------------------------------------------------------
    def receive_sql(
        self,
        model: type[Queue],
        max_batch_size: int | None = None,
        *,
        max_duration_seconds: float | None = None,
    ) -> str:
        return self.dialect.receive(
            self.declaration(model),
            max_batch_size=max_batch_size or self.batch_size,
            max_duration=self.max_duration
            if max_duration_seconds is None
            else duration(max_duration_seconds),
        )

    def receive(
        self,
        model: type[Queue],
        *,
        max_messages: int = 1,
        lease: timedelta | None = None,
        wait: float | None = None,
    ) -> list[Message]:
        # ``lease`` cannot be honoured: Spanner leases for 10 s and renews by 10 s.
        self._prune_if_due(model)
        names = key_names(model)
        label = model._meta.label
        taken = self._stream(model, max_messages).take(
            max_messages,
            self.receive_wait if wait is None else wait,
            last_sent=_last_sent.get((self.alias, label)),
            # (a stream just opened answers first: what is due, or that the queue is gone)
            first_answer=self.receive_wait,
        )
        if not taken:
            return []
        moved = _trip(self.alias, label, taken)
        # Spanner keeps no delivery count: an attempt is the failed runs workers recorded in
        # the failure ledger, plus one, read when one is first read, for the messages of the
        # batch that may have failed before (a first delivery has no record: attempt 1; none
        # is taken for one where DeliverTime moves).
        database = self.database
        maybe_failed = {
            d.key
            for d in taken
            if moved or not failures.first_delivery(d.deliver_time, d.lease_expires_at)
        }
        by_key: dict[tuple[Any, ...], Message] = {}

        def load(keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], int]:
            seen = {
                k: failures.Seen(by_key[k].deliver_time, failures.event_id(by_key[k])) for k in keys
            }
            failed = failures.failures_of(label, seen, using=database, moved=moved)
            return {key: count + 1 for key, count in failed.items()}

        attempts = AttemptLoader([d.key for d in taken if d.key in maybe_failed], load)
        received = [
            Message(
                queue=label,
                key=d.key,
                key_names=names,
                payload=d.payload,
                deliver_time=d.deliver_time,
                # resolved on first read (message._AttemptField)
                attempt=attempts,  # type: ignore[arg-type]
                lease_token=d.lease_token,
                lease_expires_at=d.lease_expires_at,
            )
            for d in taken
        ]
        by_key.update((m.key, m) for m in received)
        if not moved:
            _first_deliveries.add(received)
        return received

    def _stream(self, model: type[Queue], want: int = 1) -> ReceiveStream:
        """This process's running stream of ``model`` on this alias, started if need be, told
        that a caller wants ``want`` messages."""
        key = (self.alias, model._meta.label)
        with _streams_lock:
            stream = _streams.get(key)
            if stream is not None and stream.fatal is not None:
                # A permanent error stopped it (``take`` raised it): start afresh, the queue
                # may have been created or the permission granted since.
                del _streams[key]
                stream = None
            if stream is None:
                stream = _streams[key] = self._open_stream(model)
            stream.want(want)
            stream.start()
            return stream

    def _call_seconds(self, *, brief: bool, probe: bool) -> float:
        """``max_duration`` of a ``RECEIVE_<Q>`` call: a probe's, a brief call's or a long
        one's."""
        if probe:
            return min(PROBE_MAX_DURATION_SECONDS, self.max_duration_seconds)
        if brief:
            return self.brief_seconds
        return self.max_duration_seconds

    def _open_stream(self, model: type[Queue]) -> ReceiveStream:
        """A ``ReceiveStream`` whose calls are ``RECEIVE_<Q>`` on a strong single-use snapshot."""
        database = self.spanner()
        decl = self.declaration(model)
        n = len(decl.keys)
        current: dict[str, Any] = {}

        def open_stream(
            max_batch_size: int, *, brief: bool = False, probe: bool = False
        ) -> Iterator[Any]:
            """Start the call (``cancel`` reaches it from now on) and return its rows; the
            session goes back to the pool once they have been read (or the call failed)."""
            seconds = self._call_seconds(brief=brief, probe=probe)
            sql = self.receive_sql(model, max_batch_size, max_duration_seconds=seconds)
            deadline = seconds + 30  # the call's own gRPC deadline
            with contextlib.ExitStack() as stack:
                snapshot = stack.enter_context(database.snapshot())  # a pooled session
                call = client.receive_stream(database, snapshot._session, sql, deadline)
                current["call"] = call
                session = stack.pop_all()

            def rows() -> Iterator[Any]:
                with session:
                    try:
                        yield from client.rows_of(call)
                    finally:
                        if current.get("call") is call:  # (not the next call's)
                            del current["call"]

            return rows()

        def cancel() -> None:
            call = current.get("call")
            if call is not None:
                call.cancel()

        def renew(tokens: list[str]) -> dict[str, tuple[str | None, Any]]:
            return self.renew_tokens(model, tokens, database)

        return ReceiveStream(
            model._meta.label,
            open_stream,
            _row_parser(model, n, decl.payload_type),
            buffer_size=self.buffer_size,
            lease_margin=self.lease_margin,
            cancel=cancel,
            renew=renew,
            batch_size=self.batch_size,
            stall_seconds=LEASE.total_seconds() / 2,
            brief=(self.alias, model._meta.label) in _brief,
            probe=True,
            probes=_probes.setdefault(self.alias, Probes()),
            lease=LEASE,
            present=lambda keys: self.present_keys(model, keys),
        )

    def record_failure(
        self, model: type[Queue], message: Message, error: BaseException | None, *, using: str
    ) -> int:
        """Spanner counts no deliveries: the failed run goes to the failure ledger
        (``spanner_queues.failures``) in the caller's transaction, on every queue, so the next
        delivery's ``attempt`` is one more (the record is of this sent message only). At most
        once an hour per queue and process the records of messages that are gone are pruned
        (``prune_failures``), not in this transaction but by the queue's next ``receive``
        outside one, in a transaction of its own: a prune that fails is logged and never
        costs the record."""
        _first_deliveries.discard([message.lease_token])
        key = (self.alias, model._meta.label)
        count = failures.record_failure(message, error, using=using, moved=key in _moved)
        last = _pruned.get(key)
        if last is None or time.monotonic() - last > PRUNE_INTERVAL_SECONDS:
            _pruned[key] = time.monotonic()
            _prune_due[key] = using
        return count

    def _prune_if_due(self, model: type[Queue]) -> None:
        """Run the prune ``record_failure`` found due, unless the caller is in a transaction
        (the next ``receive`` outside one runs it)."""
        key = (self.alias, model._meta.label)
        using = _prune_due.get(key)
        if using is None or connections[using].in_atomic_block:
            return
        _prune_due.pop(key, None)
        self._prune_apart(model, using)

    def _prune_apart(self, model: type[Queue], using: str) -> None:
        """``prune_failures`` in a transaction of its own; a failure is logged (the next
        prune of the queue, an hour later, looks again)."""
        try:
            with transaction.atomic(using=using):
                self.prune_failures(model, using=using)
        except Exception:
            logger.warning(
                "pruning the failure ledger of %s failed", model._meta.label, exc_info=True
            )

    def prune_failures(
        self, model: type[Queue], *, using: str, older_than: timedelta = PRUNE_AGE
    ) -> int:
        """Delete, in the caller's transaction, the failure records of ``model`` not updated
        for ``older_than`` whose message is gone (deleted where nothing of ours ran: a
        cascade, TTL, another program), up to ``PRUNE_BATCH`` of them, going on from where the
        last prune of the queue in this process stopped: one read of the ledger, one of the
        queue by key, one delete. Returns how many were deleted."""
        limit = min(PRUNE_BATCH, MAX_QUERY_PARAMETERS // max(1, len(key_names(model))))
        position = (self.alias, model._meta.label)
        records = failures.stale_records(
            model._meta.label,
            using=using,
            before=clock.now() - older_than,
            after=_prune_from.get(position),
            limit=limit,
        )
        if len(records) < limit:  # the end of the ledger: the next prune starts again
            _prune_from.pop(position, None)
        else:
            _prune_from[position] = records[-1].updated_at
        if not records:
            return 0
        fields = key_fields(model)
        wanted = {}
        for record in records:
            values = json.loads(record.message_key)
            key = tuple(f.to_python(v) for f, v in zip(fields, values, strict=True))
            if failures.key_text(key) == record.message_key:  # (else never pruned)
                wanted[record.message_key] = key
        if not wanted:
            return 0
        names = [f.attname for f in fields]
        present: dict[str, Any] = {}
        query = rows(model, using).filter(
            functools.reduce(operator.or_, [key_filter(model, k) for k in wanted.values()])
        )
        for row in query.only(*[f.name for f in fields], "deliver_time"):
            present[failures.key_text(tuple(getattr(row, n) for n in names))] = row.deliver_time
        return failures.prune(
            [r for r in records if r.message_key in wanted],
            present,
            using=using,
            moved=position in _moved,
        )

    def stop_receiving(
        self, model: type[Queue] | None = None, *, wait: float | None = None
    ) -> None:
        """Stop this process's RECEIVE stream of ``model`` (of every queue of this alias when
        None): the stream is shared by every thread; leased rows not yet taken are dropped
        (Spanner delivers them again after their lease). ``wait`` seconds for each to end.
        Stopping every queue's also forgets what the database answered to probes."""
        label = model._meta.label if model is not None else None

        def chosen(key: tuple[str, str]) -> bool:
            return key[0] == self.alias and (label is None or key[1] == label)

        with _streams_lock:
            streams = [_streams.pop(k) for k in list(_streams) if chosen(k)]
            _brief.difference_update([k for k in _brief if chosen(k)])
            if label is None:
                _probes.pop(self.alias, None)
        for stream in streams:
            stream.stop(wait)

    def settle_receiving(
        self,
        model: type[Queue],
        *,
        wait: float | None = None,
        ignore: Collection[tuple[Any, ...]] = (),
    ) -> bool:
        """Let this process's RECEIVE stream of ``model`` come to rest (``ReceiveStream.settle``):
        its calls are brief (``brief_seconds``) until it is stopped, the open call is let end
        by its ``max_duration``, never cancelled, and, unless the last call was a look that
        found nothing (no probe, ended by its ``max_duration``, no row but keys in
        ``ignore``), one brief call looks; no other call opens until the next ``receive``
        (``wait`` seconds at most; default: a brief call's length and as much again). True
        once no row is leased to this process's stream and unread and that look found
        nothing; False while rows arrived and are held unread (``receive`` hands them out) or
        a call is open or to come."""
        key = (self.alias, model._meta.label)
        with _streams_lock:
            _brief.add(key)
            stream = _streams.get(key)
        if stream is None:
            return True
        wait = 2 * self.brief_seconds + 1.0 if wait is None else wait
        return stream.settle(wait, ignore=ignore)

    # --- renewing -------------------------------------------------------------------------
    def renew_sql(self, model: type[Queue], count: int = 1) -> str:
        return self.dialect.renew(self.declaration(model), count)

    def renew_tokens(
        self, model: type[Queue], tokens: list[str], database: Any = None
    ) -> dict[str, tuple[str | None, Any]]:
        """``RENEWLEASE_<Q>`` for ``tokens``, one call per ``MAX_QUERY_PARAMETERS`` tokens (one
        parameter each), each sent once: old token -> (new token, new expiry). A token whose
        renewal's answer was lost (now or before, ``client.RenewalOutcomeUnknown``) maps to
        itself and None: kept with the lease it had (its old expiry), never sent again (it
        may have been rotated out)."""
        now = time.monotonic()
        with _unsettled_lock:
            for token, until in list(_unsettled.items()):
                if until <= now:
                    del _unsettled[token]
            kept = [t for t in tokens if t in _unsettled]
        ask = [t for t in tokens if t not in set(kept)]
        renewed: dict[str, tuple[str | None, Any]] = {}
        if ask:
            try:
                renewed = client.renew_all(
                    database or self.spanner(),
                    lambda count: self.renew_sql(model, count),
                    self.dialect.renew_params,
                    ask,
                )
            except client.RenewalOutcomeUnknown as exc:
                renewed = exc.renewed
                until = now + LEASE.total_seconds() + 1.0  # past any old expiry
                with _unsettled_lock:
                    for token in exc.tokens:
                        _unsettled[token] = until
                kept.extend(exc.tokens)
                logger.warning(
                    "RENEWLEASE of %d lease(s) of %s sent, its answer lost (%s); not sent "
                    "again: they are kept until their old expiry at worst",
                    len(exc.tokens),
                    model._meta.label,
                    exc.__cause__,
                )
        renewed.update({token: (token, None) for token in kept})
        return renewed

    def renew_leases(self, model: type[Queue], messages: Sequence[Message]) -> list[Message]:
        """One ``RENEWLEASE_<Q>`` call for ``messages`` and, together with them, the rows this
        process's stream holds for the queue that are due for renewal. Messages whose lease
        was lost are left out of the result; those whose renewal's answer was lost
        (``renew_tokens``) are returned as they were until their old expiry, then left out."""
        with _streams_lock:
            stream = _streams.get((self.alias, model._meta.label))
        held = stream.held_tokens_due() if stream is not None else []
        tokens = list(dict.fromkeys([m.lease_token for m in messages if m.lease_token] + held))
        if not tokens:
            return []
        try:
            renewed = self.renew_tokens(model, tokens)
        except BaseException:
            if held and stream is not None:
                stream.renewal_failed(held)
            raise
        if held and stream is not None:
            stream.apply_renewals(renewed, held)
        _first_deliveries.renewed(renewed)
        result = []
        now = clock.now()
        for message in messages:
            new_token, expires = renewed.get(message.lease_token or "", (None, None))
            if new_token and new_token == message.lease_token:  # answer lost: the old lease
                if message.lease_expires_at is None or message.lease_expires_at > now:
                    result.append(message)
            elif new_token:  # no row, or a NULL new token: the lease is lost
                result.append(message.with_lease(new_token, expires))
        return result

    # --- acking ---------------------------------------------------------------------------
    def ack_many(
        self,
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        *,
        using: str,
        lease_tokens: Sequence[str | None] | None = None,
    ) -> None:
        """By key alone: Spanner's ack is a DELETE by key (``lease_tokens`` is not checked;
        ``supports_lease_checked_ack`` is False). In one transaction (the caller's, when there
        is one): one ``DELETE ... WHERE <key> IN (...) ASSERT_ROWS_MODIFIED n`` per
        ``MAX_QUERY_PARAMETERS`` key values (one round trip for a receiver's batch). A missing
        message (or a key given twice) fails the statement with ``OUT_OF_RANGE``: the
        transaction is marked for rollback and ``MessageAlreadyAcked`` raised. The assertion
        is the server's, so a transaction the DB-API replays after an abort checks it again."""
        self._require_googlesql("Acking with DML")
        if not keys:
            return
        decl = self.declaration(model)
        conn = connections[using]
        tokens = lease_tokens if lease_tokens is not None else [None] * len(keys)
        clean = _first_deliveries.take(tokens)
        # the failure records of the received messages acked go with them (none for a first
        # delivery). An ack by key alone (no lease) deletes none: one round trip per ack, as
        # before; a record it leaves is not the next message's under the key (its lease began
        # before that message's DeliverTime: ignored) and is pruned with the records of
        # messages that are gone.
        recorded = [
            k
            for k, token, first in zip(keys, tokens, clean, strict=True)
            if token is not None and not first
        ]
        with transaction.atomic(using=using), conn.cursor() as cursor:
            for chunk in client.chunks(keys, MAX_QUERY_PARAMETERS // max(1, len(decl.keys))):
                params = [v for key in chunk for v in client.prep_key(model, key, conn)]
                try:
                    cursor.execute(self.cursor_dialect.ack_many(decl, len(chunk)), params)
                except Exception as exc:
                    if grpc_status(exc) != "OUT_OF_RANGE":
                        raise
                    # Statement-level on Spanner: the transaction would still commit the
                    # caller's other writes. Never continue it: mark it for rollback.
                    transaction.set_rollback(True, using=using)
                    which = (
                        f"{tuple(chunk[0])!r}: no such message"
                        if len(chunk) == 1
                        else f": one of {list(chunk)!r} is no such message (or came twice)"
                    )
                    # (the driver's chain, gRPC's OUT_OF_RANGE under the DB-API's and
                    # Django's errors, says no more: kept as __context__, not printed)
                    raise MessageAlreadyAcked(
                        f"{model._meta.label}{which}; it was already acked (or deleted). Roll "
                        "back: the work may have been done by another receiver."
                    ) from None
            if recorded:
                failures.clear_failures(model._meta.label, recorded, using=using)
            if ordered_by(model):  # the next message of each key may go (``ordering``)
                ordering.forget_places(model, keys, using=using)

    def delete_any(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> None:
        """Delete by key, held or not, with the failure records of the messages, in one
        transaction (the caller's, when there is one): one ``DELETE ... WHERE <key> IN (...)``
        per ``MAX_QUERY_PARAMETERS`` key values (missing messages skipped), then one of the
        ledger."""
        self._require_googlesql("Deleting with DML")
        if not keys:
            return
        width = max(1, len(key_names(model)))
        decl = self.declaration(model)
        conn = connections[using]
        with transaction.atomic(using=using), conn.cursor() as cursor:
            for chunk in client.chunks(keys, MAX_QUERY_PARAMETERS // width):
                params = [v for key in chunk for v in client.prep_key(model, key, conn)]
                cursor.execute(self.cursor_dialect.delete_keys(decl, len(chunk)), params)
            failures.clear_failures(model._meta.label, keys, using=using)
            if ordered_by(model):
                ordering.forget_places(model, keys, using=using)

    def recorded_places(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> dict[tuple[Any, ...], datetime]:
        """The places the ``ordering.OrderedMessage`` rows hold (one read)."""
        return ordering.recorded_places(model, keys, using=using)

    def ack_mutations(
        self,
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        *,
        ignore_not_found: bool = False,
    ) -> Any:
        """Ack with ``Ack`` mutations committed together in a read-write transaction of their
        own, outside any Django transaction (``client.commit_mutations``: safe to retry).
        ``NOT_FOUND`` (a missing message) raises ``MessageAlreadyAcked`` and nothing is acked,
        unless ``ignore_not_found``; ``CommitOutcomeUnknown`` when the commit's answer is
        lost. Returns the commit timestamp."""
        name = self.declaration(model).name
        connection = connections[self.database]
        try:
            return client.commit_mutations(
                self.spanner(),
                acks=[
                    (name, tuple(client.prep_key(model, k, connection)), ignore_not_found or None)
                    for k in keys
                ],
            )
        except Exception as exc:
            if grpc_status(exc) == "NOT_FOUND" and "message not found" in str(exc).lower():
                raise MessageAlreadyAcked(
                    f"{model._meta.label}: Ack found no message for one of {list(keys)!r}; "
                    "nothing was acked."
                ) from None  # (gRPC's NOT_FOUND says no more: kept as __context__)
            raise

    def purge(self, model: type[Queue], *, using: str | None = None) -> None:
        """Delete every message of the queue (tests, maintenance), in the caller's transaction
        when there is one, in the forms Google documents for queues: the keys are read
        (``SELECT <keys> FROM <queue>``), then deleted by key (``DELETE ... WHERE <key> IN
        (...)``, ``MAX_QUERY_PARAMETERS`` key values a statement), never ``WHERE true``. A
        message sent meanwhile is left."""
        self._require_googlesql("Purging with DML")
        decl = self.declaration(model)
        with connections[using or self.database].cursor() as cursor:
            cursor.execute(self.cursor_dialect.keys(decl))
            keys = [tuple(row) for row in cursor.fetchall()]
            for chunk in client.chunks(keys, MAX_QUERY_PARAMETERS // max(1, len(decl.keys))):
                params = [v for key in chunk for v in key]
                cursor.execute(self.cursor_dialect.delete_keys(decl, len(chunk)), params)
        if keys and ordered_by(model):
            ordering.forget_places(
                model, [client.key_from_row(model, k) for k in keys], using=using or self.database
            )

    def present_keys(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]]
    ) -> set[tuple[Any, ...]]:
        """Which of ``keys`` are in the queue now (a strong read by key, in chunks): leased,
        backing off, scheduled or due alike."""
        decl = self.declaration(model)
        conn = connections[self.database]
        found: set[tuple[Any, ...]] = set()
        with conn.cursor() as cursor:
            for chunk in client.chunks(list(keys), MAX_QUERY_PARAMETERS // len(decl.keys)):
                params = [v for key in chunk for v in client.prep_key(model, key, conn)]
                cursor.execute(self.cursor_dialect.select_keys(decl, len(chunk)), params)
                found.update(client.key_from_row(model, row) for row in cursor.fetchall())
        return found

    # --- observing ------------------------------------------------------------------------
    def lease_expirations(self, model: type[Queue]) -> int:
        """Rows this process's ``RECEIVE_<Q>`` stream held whose lease ran out before they
        were handed out (``ReceiveStream.lease_expiration_count``). Leases that run out in a
        receiver's hands are the worker's lost leases; Spanner's own metric counts both."""
        with _streams_lock:
            stream = _streams.get((self.alias, model._meta.label))
        return stream.lease_expiration_count if stream is not None else 0

    def deliver_time_moves(self, model: type[Queue]) -> int:
        """Deliveries of ``model`` this process saw with a ``DeliverTime`` later than their
        lease's start: proof that Spanner moves it on a lease (the tripwire, ``_trip``)."""
        return _moves[(self.alias, model._meta.label)]

    def stats(self, model: type[Queue]) -> QueueStats:
        """Counts by ``DeliverTime`` only: Spanner does not expose leases, so in-flight
        messages count as ``ready`` and ``leased`` is always 0. One strong read that scans
        the queue, with a deadline (``client.query``); when it cannot be had,
        ``QueueUnavailable`` (a ``QueueError``) within ``client.CALL_DEADLINE_SECONDS``."""
        now = clock.now()
        try:
            [(total, due, oldest)] = client.query(
                self.spanner(), self.dialect.stats(self.declaration(model))
            )
        except gexc.GoogleAPIError as exc:
            raise QueueUnavailable(
                f"stats of {model._meta.label} could not be read: {type(exc).__name__}: {exc}"
            ) from exc
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
        reason = self._no_queues_reason(self.database)
        if reason is None:
            return []
        return [
            checks.Error(
                f"SPANNER_QUEUES[{self.alias!r}] uses the native engine, but database "
                f"{self.database!r} cannot hold Spanner queues: {reason}",
                hint="Use 'ENGINE': 'table' for this database (SQLite, PostgreSQL, the Spanner "
                "emulator), and 'native' only for a real Spanner database of the Enterprise or "
                "Enterprise Plus edition.",
                id="spanner_queues.E007",
            )
        ]

    # --- the database's connections ---------------------------------------------------------
    def connection_created(
        self, connection: BaseDatabaseWrapper, queue_tables: Callable[[], set[str]]
    ) -> None:
        """Keep queues out of Django's table listings (``flush``, ``inspectdb``, migrations),
        and bound the client's retries of the connection's streaming reads.

        django_spanner lists every row of ``information_schema.tables`` and calls everything
        that is not a ``VIEW`` a table, so a queue would be flushed with ``DELETE`` like a
        table and turned into a model by ``inspectdb``. The connection's
        ``introspection.get_table_list`` is wrapped (once): queues are reported with type
        ``"q"``, which Django's ``table_names()``, ``flush`` and ``inspectdb`` skip. A relation
        is a queue when ``queue_tables()`` names it (the lower-cased tables of the declared
        queues on this database), or when ``information_schema.tables`` gives it a type other
        than ``BASE TABLE`` or ``VIEW`` (the value Spanner uses for queues is not
        documented). The client's streaming reads (the cursor's queries) would retry
        UNAVAILABLE for ever, its commits for an hour: ``client.bound_streaming_reads``. A
        closed connection stops its session-maintenance thread
        (``client.stop_sessions_on_close``). An aborted transaction whose ABORTED carries no
        ``RetryInfo`` is replayed after a short delay, not ``2**attempt`` seconds
        (``client.bound_aborted_replays``)."""
        if self._no_queues_reason(connection.alias) is not None:
            return
        database = getattr(connection.connection, "database", None)
        if database is not None:
            client.bound_streaming_reads(database)
            client.stop_sessions_on_close(connection.connection)
            client.bound_aborted_replays(connection.connection)
        introspection: Any = connection.introspection
        if getattr(introspection, "_spanner_queues_wrapped", False):
            return
        original = introspection.get_table_list

        def get_table_list(cursor: Any) -> list[TableInfo]:
            queues = queue_tables()
            runner = getattr(cursor, "run_sql_in_snapshot", None)
            if runner is None:  # a Django cursor wrapper: reach the DB-API cursor
                runner = getattr(getattr(cursor, "cursor", None), "run_sql_in_snapshot", None)
            if runner is not None:
                queues |= {str(row[0]).lower() for row in runner(_OTHER_TYPES_SQL)}
            return [
                TableInfo(info.name, QUEUE) if info.name.lower() in queues else info
                for info in original(cursor)
            ]

        introspection.get_table_list = get_table_list
        introspection._spanner_queues_wrapped = True
