"""What differs between database vendors, and nothing else.

This is the only module that names a vendor. Engines ask the driver which errors are worth a
retry, what the database must be configured with, and how to emit vendor DDL clauses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import cached_property
from importlib import metadata
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (Django wraps DB-API wraps gRPC)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def grpc_status(exc: BaseException) -> str | None:
    """The gRPC status name (``"ABORTED"``, ``"NOT_FOUND"``...) of the first Google API error
    in the chain (``google.api_core``'s ``GoogleAPICallError.grpc_status_code``), None if none.
    Read from the error, so that a project on another database never loads the Google client
    (its import costs about 0.1 s of every process start)."""
    for error in causes(exc):
        code = getattr(error, "grpc_status_code", None)
        if code is not None:
            return str(code.name)
    return None


class Driver:
    """Defaults for a database with transactions and no vendor quirks."""

    vendor = "generic"
    #: whether the database can hold native Spanner queues (``CREATE QUEUE``).
    supports_native_queues = False
    #: whether a new connection is handed to ``connection_created`` (and to the native
    #: engines on its database): only where one of them acts on it (Spanner)
    acts_on_new_connections = False
    #: why not, for system check E007.
    no_native_queues_reason = "only Cloud Spanner has queues."
    #: whether ``INTERLEAVE IN PARENT`` exists; elsewhere the ORM cascade stands in for it.
    supports_interleave = False
    #: whether a table can have a row deletion policy (Spanner's TTL: ``ROW DELETION POLICY``)
    supports_row_deletion_policy = False
    #: whether the DB-API replays an aborted transaction's statements by itself, checking only
    #: what was fetched (django_spanner): a DML row count checked in Python is then not
    #: re-checked, so a statement whose outcome matters must be preceded by a read of it.
    replays_aborted_transactions = False
    #: whether one write lock serves every writer of the database (SQLite): a receiver's
    #: transaction then holds it while the receiver runs, so nobody renews a lease, nor claims
    #: a message, meanwhile.
    single_writer = False
    #: whether a savepoint that ends well is released at once (``RELEASE SAVEPOINT``); where a
    #: statement is a round trip (PostgreSQL) it is left to the commit, which releases every
    #: savepoint, and a grouped receiver costs one statement, not two
    releases_savepoints = True
    #: whether ``executemany`` sends its statements in one round trip (psycopg 3's pipeline):
    #: where it does, many rows go as one statement each in one ``executemany``, not as one
    #: statement of many rows, which the driver would parse again for every call
    pipelines_executemany = False
    #: whether a claim of the due rows from the head is one statement (PostgreSQL: ``UPDATE
    #: ... FROM (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``, one lease token for the
    #: claim), not a read and then a compare-and-set for each row
    claims_in_one_statement = False
    #: whether many rows can go as one array parameter per column (PostgreSQL's ``unnest``):
    #: a batch's acks (the rows whose key and token are among the arrays') and the relay's
    #: archive rows are then one statement, not one a row
    supports_array_parameters = False
    #: whether many new rows can go as one ``COPY ... FROM STDIN`` (psycopg 3): the relay's
    #: archive rows, a third of what ``INSERT ... unnest`` of the same rows cost the server
    supports_copy = False

    @property
    def supports_json_each(self) -> bool:
        """Whether many rows can go as one JSON array parameter read by ``json_each`` (SQLite
        with its JSON functions): a claim of the due rows from the head is then a read of them
        with their ``rowid`` and one ``UPDATE`` of those rowids, one lease token for the claim
        (SQLite's ``RETURNING`` cannot name the read's columns: the deliver time and lease a
        row had; its one writer holds the rows between the two), and a batch's acks one
        ``DELETE`` of the rows whose key and token are among the array's, not one a row."""
        return False

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection

    @property
    def has_savepoints(self) -> bool:
        """Whether a transaction can roll back part of itself (Django's own feature flags:
        SQLite, PostgreSQL; not Spanner): the worker's groups run each receiver in its own."""
        features = self.connection.features
        return bool(features.uses_savepoints and features.can_release_savepoints)

    def datetime_param(self) -> Callable[[datetime | None], Any]:
        """How an aware datetime (or None) of a plain ``DateTimeField`` becomes a parameter on
        this connection: what the field's ``get_db_prep_save`` comes to for it (the backend's
        ``adapt_datetimefield_value``). The hot path's statements use it for each row."""
        return self.connection.ops.adapt_datetimefield_value

    def datetime_reader(self) -> Callable[[Any, Any, Any], Any] | None:
        """A faster equivalent of the backend's ``convert_datetimefield_value`` (a DB
        converter: ``(value, expression, connection)``), or None: the backend's own."""
        return None

    def is_retryable(self, exc: BaseException) -> bool:
        """True when ``exc`` means "the transaction lost a race; run it again"."""
        return False

    def is_connection_lost(self, exc: BaseException) -> bool:
        """True when ``exc`` means the connection (or the server-side session behind it) is
        gone for good: the connection must be closed and opened again, and a transaction that
        failed so committed nothing and may be run again on the new one."""
        return False

    def connection_created(self) -> None:
        """The driver's connection was just opened (Django's ``connection_created``): called
        only for the drivers with ``acts_on_new_connections`` (``introspection.connect``)."""

    def connection_lost(self) -> None:
        """The driver's connection is lost for good (``is_connection_lost``) and about to be
        closed: forget what outlives it."""

    def is_duplicate_key(self, exc: BaseException) -> bool:
        """True when an INSERT failed because the primary key exists."""
        text = str(exc).lower()
        return "unique" in text or "already exists" in text or "duplicate" in text

    def is_missing_parent(self, exc: BaseException) -> bool:
        """True when an INSERT into an interleaved table found no parent row."""
        return False

    @property
    def claims_skip_locked(self) -> bool:
        """Whether a claim reads its due rows with ``SELECT ... FOR UPDATE SKIP LOCKED``, so
        that concurrent claimers pass over each other's rows instead of waiting on them and
        losing the compare-and-set (Django's own feature flag: PostgreSQL, MySQL 8, Oracle;
        not SQLite nor Spanner, which has no FOR UPDATE)."""
        return bool(getattr(self.connection.features, "has_select_for_update_skip_locked", False))

    #: 0: a claim reads the first due rows of the DeliverTime index in its read-write
    #: transaction. K > 0: it picks its rows at random among the first K x max_messages due
    #: rows, read outside the transaction, and reads (locks) only those; for databases with
    #: no ``SKIP LOCKED`` whose read-write transactions lock what they read (Spanner), where
    #: N claimers of the head would abort each other.
    claim_window = 0

    def check(self) -> list[checks.CheckMessage]:
        return []

    def versions(self) -> tuple[str, str]:
        """The DB-API driver and the database server, each with its version, as far as they
        can be read (for reports: ``queuedrill``)."""
        database = _dbapi(self.connection)
        return f"{database.__name__} {getattr(database, '__version__', '')}".strip(), "unknown"

    def write_lock(self, timeout: float | None = None) -> contextlib.AbstractContextManager[bool]:
        """A context held around the outermost read-write transaction spanner_queues opens
        itself (``run_in_transaction``), never around a caller's ``atomic()`` block; it yields
        whether the lock is held. A null context (always held) unless the database has a
        single write lock that threads of one process would otherwise queue on by sleeping.
        ``timeout``: how long to wait for it (default: the connection's lock timeout, after
        which the transaction goes on without it, under the database's own locking)."""
        return contextlib.nullcontext(True)


#: one re-entrant lock per SQLite database file (by real path, and by each name it was seen
#: under), for every thread of this process
_sqlite_write_locks: dict[str, threading.RLock] = {}
_sqlite_write_locks_guard = threading.Lock()


@contextlib.contextmanager
def _acquired(lock: threading.RLock, timeout: float) -> Iterator[bool]:
    # Bounded (by default by the connection's busy timeout): if the lock is not had by then
    # (e.g. a receiver waits on another thread that needs it), the caller goes on without it;
    # SQLite's own locking still applies, exactly as without this lock.
    got = lock.acquire(timeout=timeout)
    try:
        yield got
    finally:
        if got:
            lock.release()


class SQLiteDriver(Driver):
    vendor = "sqlite"
    no_native_queues_reason = "SQLite has no queues (CREATE QUEUE is Cloud Spanner DDL)."
    single_writer = True

    @property
    def supports_json_each(self) -> bool:
        """Where SQLite has its JSON functions (Django's own flag; built in since 3.38)."""
        return bool(self.connection.features.supports_json_field)

    def is_retryable(self, exc: BaseException) -> bool:
        text = str(exc).lower()
        return "database is locked" in text or "database table is locked" in text

    def datetime_param(self) -> Callable[[datetime | None], Any]:
        """With ``USE_TZ``: Django's SQLite adapter for an aware datetime (naive in the
        connection's time zone, as text) without its checks and settings lookups (2.6 us a
        value against 1)."""
        if not settings.USE_TZ:
            return super().datetime_param()
        tz = self.connection.timezone

        def adapt(value: datetime | None) -> Any:
            return None if value is None else str(value.astimezone(tz).replace(tzinfo=None))

        return adapt

    def datetime_reader(self) -> Callable[[Any, Any, Any], Any] | None:
        """With ``USE_TZ``: Django's SQLite converter (ISO text -> aware in the connection's
        time zone) without its settings lookups; text ``fromisoformat`` cannot read goes to
        Django's own."""
        if not settings.USE_TZ:
            return None
        tz = self.connection.timezone
        ops: Any = self.connection.ops
        convert = ops.convert_datetimefield_value

        def read(value: Any, expression: Any, connection: Any) -> Any:
            if value is None:
                return None
            if not isinstance(value, datetime):
                try:
                    value = datetime.fromisoformat(value)
                except (TypeError, ValueError):
                    return convert(value, expression, connection)
            return value if value.tzinfo is not None else value.replace(tzinfo=tz)

        return read

    def versions(self) -> tuple[str, str]:
        return (
            f"sqlite3 of Python {platform.python_version()}",
            f"SQLite {_dbapi(self.connection).sqlite_version}",
        )

    def write_lock(self, timeout: float | None = None) -> contextlib.AbstractContextManager[bool]:
        """SQLite has one write lock per database file. Threads of one process that collide
        on it are parked by SQLite's busy handler, which sleeps (1, 2, 5, 10 ms...) and so
        wastes most of the time of short transactions; queuing them on a process-wide
        re-entrant lock per file hands the write lock over at once. Other processes still
        meet SQLite's own locking."""
        settings = self.connection.settings_dict
        name = str(settings.get("NAME") or "")
        lock = _sqlite_write_locks.get(name)
        if lock is None:
            if name in ("", ":memory:") or name.startswith("file:"):
                key = name  # in-memory (or URI) databases: one per name
            else:
                key = os.path.realpath(name)  # one lock per file, however it is named
            with _sqlite_write_locks_guard:
                lock = _sqlite_write_locks.setdefault(key, threading.RLock())
                _sqlite_write_locks[name] = lock
        if timeout is None:
            timeout = float((settings.get("OPTIONS") or {}).get("timeout", 5))
        return _acquired(lock, timeout)

    def check(self) -> list[checks.CheckMessage]:
        alias = self.connection.alias
        options = self.connection.settings_dict.get("OPTIONS") or {}
        problems: list[checks.CheckMessage] = []
        if options.get("transaction_mode") != "IMMEDIATE":
            problems.append(
                checks.Error(
                    f"Database {alias!r} (SQLite) does not use transaction_mode='IMMEDIATE'.",
                    hint=(
                        f"Set DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] = "
                        "'IMMEDIATE': with SQLite's default DEFERRED mode, concurrent "
                        "receivers fail with 'database is locked'."
                    ),
                    id="spanner_queues.E003",
                )
            )
        init = str(options.get("init_command", "")).lower().replace(" ", "")
        name = str(self.connection.settings_dict.get("NAME", ""))
        if "journal_mode=wal" not in init and name not in ("", ":memory:"):
            problems.append(
                checks.Warning(
                    f"Database {alias!r} (SQLite) does not enable WAL journaling.",
                    hint=(
                        f"Add 'PRAGMA journal_mode=WAL;' to DATABASES[{alias!r}]['OPTIONS']"
                        "['init_command'] so that readers do not block the worker."
                    ),
                    id="spanner_queues.W001",
                )
            )
        return problems


class SpannerDriver(Driver):
    vendor = "spanner"
    supports_interleave = True
    supports_row_deletion_policy = True
    replays_aborted_transactions = True
    claim_window = 8
    #: (but Google's emulator has no queues: the native engine asks the emulator it is on)
    supports_native_queues = True
    acts_on_new_connections = True

    def versions(self) -> tuple[str, str]:
        driver = ", ".join(
            f"{name} {_distribution_version(name)}"
            for name in ("django-google-spanner", "google-cloud-spanner")
        )
        emulator = os.environ.get("SPANNER_EMULATOR_HOST")
        server = f"Cloud Spanner emulator at {emulator}" if emulator else "Cloud Spanner"
        return driver, server

    def is_retryable(self, exc: BaseException) -> bool:
        """ABORTED, the DB-API's ``RetryAborted`` (its replay of an aborted transaction read
        other rows; known by name, so that no other database loads the DB-API), or a
        transaction the server no longer knows."""
        if grpc_status(exc) == "ABORTED":
            return True
        for current in causes(exc):
            if type(current).__name__ == "RetryAborted":
                return True
            text = str(current)
            if "Transaction not found" in text or "was aborted" in text:
                return True
        return False

    def is_connection_lost(self, exc: BaseException) -> bool:
        """``NOT_FOUND: Session not found``: Spanner deletes sessions idle for about an hour
        and on backend restarts; the client keeps using the one it has, so only a new
        connection (a new client and session) gets past it. The transaction it failed in
        was on that session: nothing of it committed."""
        return grpc_status(exc) == "NOT_FOUND" and any(
            "session not found" in str(e).lower() for e in causes(exc)
        )

    def connection_created(self) -> None:
        """Give a new connection a google-cloud-spanner ``Database`` already made for the same
        database (and role): the DB-API builds a new one per connection, and with it a new
        multiplexed session on the server that nothing deletes, so a worker that reconnected
        after each of five outages held about two more sessions each time (issue 37).

        A thread that reconnects gets its last one; a new thread gets one a finished thread
        gave back (a worker replaces the threads an outage ended), else keeps its own. One
        ``Database`` per live thread, not per process: Google's emulator refuses concurrent
        read-write transactions on one multiplexed session ("Invalid transaction ID"), and a
        thread runs one at a time. So the sessions a process holds are bounded by the most
        threads it ever ran at once. A lost session forgets it (``connection_lost``)."""
        dbapi = self.connection.connection
        database = getattr(dbapi, "database", None)
        if database is None or getattr(database, "_instance", None) is None:
            return
        kept = _kept_databases()
        key = _database_key(database)
        reused = kept.get(key)
        if reused is None:
            with _given_back_guard:
                free = _given_back.get(key)
                reused = free.pop() if free else database
            kept[key] = reused
        if reused is not database:
            dbapi._database = reused

    def connection_lost(self) -> None:
        """The session behind this thread's ``Database`` is gone ("Session not found"): the
        next connection builds a new one (the client would keep using the lost session), and
        the lost one is never given to another thread."""
        database = getattr(self.connection.connection, "database", None)
        if database is None or getattr(database, "_instance", None) is None:
            return
        kept = _kept_databases()
        if kept.get(_database_key(database)) is database:
            del kept[_database_key(database)]

    def is_duplicate_key(self, exc: BaseException) -> bool:
        return grpc_status(exc) == "ALREADY_EXISTS"

    def is_missing_parent(self, exc: BaseException) -> bool:
        """NOT_FOUND for a row whose interleave parent is missing, in Spanner's words ("Parent
        row for row [...] in table X is missing. Row cannot be written.") or the emulator's
        ("Insert failed because key was not found in parent table")."""
        return grpc_status(exc) == "NOT_FOUND" and any(
            _MISSING_PARENT.search(str(e)) is not None for e in causes(exc)
        )


#: each thread's google-cloud-spanner ``Database`` per (client, instance, database, role),
#: reused when the thread reconnects (``SpannerDriver.connection_created``)
_thread_databases = threading.local()

_DatabaseKey = tuple[int, str, str, str | None]

#: the ``Database`` objects of finished threads, for the next thread that connects: at most
#: one per thread that was alive at the same time as the others
_given_back: dict[_DatabaseKey, list[Any]] = {}
_given_back_guard = threading.Lock()


def _give_back(kept: dict[_DatabaseKey, Any]) -> None:
    with _given_back_guard:
        for key, database in kept.items():
            _given_back.setdefault(key, []).append(database)


def _kept_databases() -> dict[_DatabaseKey, Any]:
    """This thread's kept ``Database`` objects, by ``_database_key``."""
    holder: _KeptHolder | None = getattr(_thread_databases, "holder", None)
    if holder is None:
        holder = _thread_databases.holder = _KeptHolder()
    return holder.kept


class _KeptHolder:
    """Lives in the thread's ``threading.local`` and nowhere else: it is collected when its
    thread ends, and its finalizer gives the thread's databases back (the dict, not the
    holder, is the finalizer's argument, so the holder can be collected)."""

    __slots__ = ("__weakref__", "kept")

    def __init__(self) -> None:
        self.kept: dict[_DatabaseKey, Any] = {}
        weakref.finalize(self, _give_back, self.kept)


def _database_key(database: Any) -> _DatabaseKey:
    instance = database._instance
    return (
        id(instance._client),
        instance.instance_id,
        database.database_id,
        database.database_role,
    )


#: a missing interleave parent, as Spanner and as the emulator word it
_MISSING_PARENT = re.compile(
    r"Parent row for row \[.*\] in table \S+ is missing|key was not found in parent table",
    re.S,
)

#: PostgreSQL SQLSTATEs worth running the transaction again for
_PG_RETRYABLE = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
#: PostgreSQL SQLSTATEs of a connection the server ended: admin_shutdown ("terminating
#: connection due to administrator command": pg_terminate_backend, a restart), crash_shutdown,
#: and the connection_exception class (08xxx)
_PG_CONNECTION_GONE = frozenset({"57P01", "57P02", "57P03"})


class PostgreSQLDriver(Driver):
    vendor = "postgresql"
    # a RELEASE is a round trip (half of a grouped no-op receiver's cost); a savepoint left
    # open nests the next one of the same name, and ROLLBACK TO names the innermost
    releases_savepoints = False
    # one UPDATE ... RETURNING leases a claim's rows: a row's UPDATE cost the server more than
    # the message's whole delivery otherwise (the relay's claims: docs/benchmarks.md)
    claims_in_one_statement = True
    supports_array_parameters = True

    @cached_property
    def supports_copy(self) -> bool:  # type: ignore[override]
        """psycopg 3's cursors ``copy()``; psycopg2's take another interface, left alone."""
        return hasattr(_dbapi(self.connection), "Copy")

    @cached_property
    def pipelines_executemany(self) -> bool:  # type: ignore[override]
        """psycopg 3 with a libpq that has pipelines (14 and later) sends an ``executemany``
        in one round trip; it parses a statement's placeholders once and caches them only
        for statements of up to 50 parameters (a group's task results in one ``INSERT``: 380,
        a third of the worker's time on PostgreSQL in parsing them)."""
        pipeline = getattr(_dbapi(self.connection), "Pipeline", None)
        return bool(pipeline is not None and pipeline.is_supported())

    def versions(self) -> tuple[str, str]:
        driver, _ = super().versions()
        implementation = getattr(getattr(_dbapi(self.connection), "pq", None), "__impl__", None)
        if implementation:  # psycopg 3: "python", "c" or "binary"
            driver += f" ({implementation} implementation)"
        with self.connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            (server,) = cursor.fetchone()
        return driver, f"PostgreSQL {server}"

    def is_retryable(self, exc: BaseException) -> bool:
        """Serialization failures and deadlocks, as psycopg 3 (``sqlstate``) and psycopg2
        (``pgcode``) report them, wherever they sit in the chain Django wraps."""
        for current in causes(exc):
            code = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
            if code in _PG_RETRYABLE:
                return True
        return False

    def is_connection_lost(self, exc: BaseException) -> bool:
        """The server ended the connection (a terminated backend, a restart, a dropped
        socket): psycopg marks it closed or broken, or the error carries a connection
        SQLSTATE. A transaction that failed so committed nothing that it could still commit,
        and the worker's transactions hold their ack: run again, each is at most once."""
        raw = getattr(self.connection, "connection", None)
        if raw is not None and (getattr(raw, "closed", False) or getattr(raw, "broken", False)):
            return True
        for current in causes(exc):
            code = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
            if code in _PG_CONNECTION_GONE or (isinstance(code, str) and code.startswith("08")):
                return True
        return False


_DRIVERS: dict[str, type[Driver]] = {
    "sqlite": SQLiteDriver,
    "spanner": SpannerDriver,
    "postgresql": PostgreSQLDriver,
}


#: the Django database backend on Cloud Spanner (django-google-spanner)
SPANNER_BACKEND = "django_spanner"
#: what a Spanner project installs, beyond the app itself (the ``spanner`` extra)
SPANNER_EXTRA = "spanner-queues[spanner]"


def missing_spanner_packages(native: bool) -> list[str]:
    """The distributions of the ``spanner`` extra that cannot be imported: django-google-spanner
    (the ``django_spanner`` backend) and, for the native engine (``native``), Google's client
    google-cloud-spanner. Finds them without importing them."""
    missing = []
    wanted = [(SPANNER_BACKEND, "django-google-spanner")]
    if native:
        wanted.append(("google.cloud.spanner_v1", "google-cloud-spanner"))
    for module, distribution in wanted:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a parent package (google, google.cloud) is missing
            found = False
        if not found:
            missing.append(distribution)
    return missing


def driver_for(alias: str) -> Driver:
    """The driver for database ``alias`` (the one place vendor strings are matched)."""
    return driver_of(connections[alias])


def driver_of(connection: BaseDatabaseWrapper) -> Driver:
    """The driver of ``connection``, which may be none of ``connections`` (a backend's
    connection to its maintenance database, alias ``__no_db__``, made while creating a test
    database)."""
    # One per connection (each thread has its own): the hot path asks several times a message.
    driver = connection.__dict__.get("_spanner_queues_driver")
    if driver is None:
        driver = _DRIVERS.get(connection.vendor, Driver)(connection)
        connection.__dict__["_spanner_queues_driver"] = driver
    return driver


def _dbapi(connection: BaseDatabaseWrapper) -> Any:
    """The DB-API module behind ``connection`` (each backend's ``Database`` attribute)."""
    # django-stubs declare no ``Database`` on BaseDatabaseWrapper; every backend sets it
    return connection.Database  # type: ignore[attr-defined]


def _distribution_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def describe(value: Any) -> str:
    return f"{type(value).__name__}: {value}"
