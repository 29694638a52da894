"""The native engine: real Spanner queues (Enterprise and Enterprise Plus editions).

- Schema: ``CREATE QUEUE`` / ``DROP QUEUE`` (``spanner_queues.native.ddl``).
- Send: ``INSERT`` DML through the caller's Django connection and transaction (the outbox), one
  statement per 950 query parameters; ``send_mutations`` writes ``Send`` mutations for batches
  made outside the ORM, in a read-write transaction of their own (safe to retry).
- Receive: a background ``RECEIVE_<Q>`` stream per queue and process on a strong single-use
  snapshot, through google-cloud-spanner directly (``spanner_queues.native.streams`` keeps them,
  ``spanner_queues.native.receive`` runs one).
- Renew: one ``RENEWLEASE_<Q>`` call per queue and 950 tokens; tokens rotate.
- Ack: ``DELETE ... ASSERT_ROWS_MODIFIED n`` in the caller's transaction, one statement for a
  batch (``OUT_OF_RANGE`` -> ``MessageAlreadyAcked``, the transaction is marked for rollback);
  ``ack_mutations`` for batches outside it.
  The DML and mutations are written by ``spanner_queues.native.messages``.

Settings (``SPANNER_QUEUES[alias]["OPTIONS"]``): ``DIALECT`` ("googlesql" | "postgresql"),
``RECEIVE_MAX_DURATION_SECONDS`` (1200), ``RECEIVE_BATCH_SIZE`` (10), ``RECEIVE_WAIT_SECONDS``
(1.0), ``RECEIVE_BUFFER_SIZE`` (100), ``LEASE_MARGIN_SECONDS`` (0.5).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections

from spanner_queues import clock, failures
from spanner_queues.conf import EngineParams
from spanner_queues.drivers import driver_for
from spanner_queues.engines.base import BaseQueueEngine, EngineFeatures, QueueStats
from spanner_queues.exceptions import (
    InvalidQueueEngine,
    NotSupportedByEngine,
    QueueConfigurationError,
    QueueUnavailable,
)
from spanner_queues.keys import key_filter, key_names
from spanner_queues.message import AttemptLoader, Message, OutgoingMessage
from spanner_queues.native import client, streams
from spanner_queues.native import messages as messages_on_wire
from spanner_queues.native.ddl import GOOGLESQL, QueueDeclaration, declare, dialect, duration
from spanner_queues.native.streams import (  # noqa: F401 (re-exported: tests, callers)
    NATIVE_LEASE,
    _streams,
    _streams_lock,
    stop_all_streams,
)
from spanner_queues.options import queue_options
from spanner_queues.storage import rows

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions

logger = logging.getLogger("spanner_queues.native")


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

    def spanner(self) -> Any:
        """The google-cloud-spanner ``Database`` behind this engine's database alias."""
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
        streams.sent(self.alias, model._meta.label)
        return messages_on_wire.insert(self, model, messages, using=using)

    def send_mutations(self, model: type[Queue], messages: Sequence[OutgoingMessage]) -> Any:
        """Send with ``Send`` mutations committed together in a read-write transaction of
        their own, outside any Django transaction (``CommitOutcomeUnknown`` when the commit's
        answer is lost). Returns the commit timestamp."""
        streams.sent(self.alias, model._meta.label)
        return messages_on_wire.send_mutations(self, model, messages)

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
        names = key_names(model)
        receiver = streams.stream_for(self, model, max_messages)
        taken = receiver.take(
            max_messages,
            self.receive_wait if wait is None else wait,
            last_sent=streams.last_sent(self.alias, model._meta.label),
            # (a stream just opened answers first: what is due, or that the queue is gone)
            first_answer=self.receive_wait,
        )
        if not taken:
            return []
        # Spanner keeps no delivery count: an attempt is the failed runs workers recorded in
        # the failure ledger, plus one, read for the whole batch when one is first read.
        label, database = model._meta.label, self.database

        def load(keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], int]:
            failed = failures.failures_of(label, keys, using=database)
            return {key: count + 1 for key, count in failed.items()}

        attempts = AttemptLoader([d.key for d in taken], load)
        return [
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

    def record_failure(
        self, model: type[Queue], message: Message, error: BaseException | None, *, using: str
    ) -> int:
        """Spanner counts no deliveries: the failed run goes to the failure ledger
        (``spanner_queues.failures``) in the caller's transaction, on every queue, so the next
        delivery's ``attempt`` is one more."""
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
        label = model._meta.label if model is not None else None
        streams.stop_streams(self.alias, label, wait)

    def settle_receiving(self, model: type[Queue], *, wait: float | None = None) -> bool:
        """Let this process's RECEIVE stream of ``model`` come to rest: its calls are brief
        (``streams.BRIEF_MAX_DURATION_SECONDS``) until it is stopped, no new call opens until
        the next ``receive``, and the open call is let end by its ``max_duration``, never
        cancelled (``wait`` seconds at most; default: a brief call's length and as much
        again). True once no row is leased to this process's stream and unread; False while
        rows arrived and are held unread (``receive`` hands them out) or a call is still
        open."""
        return streams.settle(self, model, wait)

    def renew_sql(self, model: type[Queue], count: int = 1) -> str:
        return self.dialect.renew(self.declaration(model), count)

    def renew_leases(self, model: type[Queue], messages: Sequence[Message]) -> list[Message]:
        """One ``RENEWLEASE_<Q>`` call for ``messages`` and, together with them, the rows this
        process's stream holds for the queue that are due for renewal."""
        return streams.renew_leases(self, model, messages)

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
        ``supports_lease_checked_ack`` is False)."""
        self._require_googlesql("Acking with DML")
        messages_on_wire.delete(self, model, keys, using=using)

    def delete_any(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> None:
        for key in keys:
            rows(model, using).filter(key_filter(model, key)).delete()

    def ack_mutations(
        self,
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        *,
        ignore_not_found: bool = False,
    ) -> Any:
        """Ack with ``Ack`` mutations committed together in a read-write transaction of their
        own, outside any Django transaction. ``NOT_FOUND`` (a missing message) raises
        ``MessageAlreadyAcked`` and nothing is acked, unless ``ignore_not_found``;
        ``CommitOutcomeUnknown`` when the commit's answer is lost. Returns the commit
        timestamp."""
        return messages_on_wire.ack_mutations(self, model, keys, ignore_not_found=ignore_not_found)

    def purge(self, model: type[Queue], *, using: str | None = None) -> None:
        """Delete every message of the queue (tests, maintenance)."""
        self._require_googlesql("Purging with DML")
        with connections[using or self.database].cursor() as cursor:
            cursor.execute(self.cursor_dialect.purge(self.declaration(model)))

    # --- observing ------------------------------------------------------------------------
    def lease_expirations(self, model: type[Queue]) -> int:
        """Rows this process's ``RECEIVE_<Q>`` stream held whose lease ran out before they
        were handed out (``Receiver.lease_expiration_count``). Leases that run out in a
        receiver's hands are the worker's lost leases; Spanner's own metric counts both."""
        with _streams_lock:
            receiver = _streams.get((self.alias, model._meta.label))
        return receiver.lease_expiration_count if receiver is not None else 0

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
        except Exception as exc:
            from google.api_core import exceptions as gexc

            if isinstance(exc, (gexc.GoogleAPIError,)):
                raise QueueUnavailable(
                    f"stats of {model._meta.label} could not be read: {type(exc).__name__}: {exc}"
                ) from exc
            raise
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
