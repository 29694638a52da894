"""Short read-write transactions with retry on the errors a driver calls retryable.

Spanner aborts transactions that lose a race, and SQLite reports "database is locked"; both are
safe to run again from the start. Inside a caller's ``atomic()`` block nothing can be retried
(there are no savepoints on Spanner), so the function runs once, in the caller's transaction.

Outside one, each attempt runs under the driver's ``write_lock()`` (SQLite: threads of this
process queue for the database file's single write lock in Python instead of sleeping in
SQLite's busy handler; elsewhere nothing).

``holding`` runs a write under a lock of the caller's that other threads take inside their own
transactions (the worker's renewal lock), in the order the database needs: on a single-writer
database (``Driver.single_writer``: SQLite) that lock is taken only once the database's write
lock is had, so callers never wait for the database while holding it.

A lost connection (``Driver.is_connection_lost``: Spanner's "Session not found", which is no
Django ``DatabaseError``, so Django would keep the connection for good) is closed, so that the
next use reconnects (``forget_lost_connection``); outside a caller's ``atomic()`` block the
transaction then runs again on the new connection (it committed nothing on the lost one).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django.db import DatabaseError, Error, connections, transaction
from django.db.transaction import TransactionManagementError

from spanner_queues.drivers import driver_for, driver_of
from spanner_queues.exceptions import MessageAlreadyAcked, StaleAck

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from spanner_queues.clock import Throttle

__all__ = ["run_in_transaction"]

T = TypeVar("T")
logger = logging.getLogger("spanner_queues.transactions")

#: transactions run again after a retryable error (Spanner ABORTED, SQLite "locked",
#: PostgreSQL serialization failure), per database alias, in this process: benchmarks read it
#: to count aborted claims per message (``retry_counts()``)
_retries: dict[str, int] = {}
_retries_lock = threading.Lock()


def retry_counts() -> dict[str, int]:
    """How many times ``run_in_transaction`` ran a transaction again, per alias, in this
    process (a copy)."""
    with _retries_lock:
        return dict(_retries)


#: set on a connection found lost inside a caller's atomic() block (closed after it)
_LOST = "_spanner_queues_lost"


def close_lost_connections() -> None:
    """Close this thread's connections found lost (``forget_lost_connection``) once no
    ``atomic()`` block is open on them."""
    for conn in connections.all(initialized_only=True):
        if conn.__dict__.get(_LOST) and not conn.in_atomic_block:
            conn.__dict__.pop(_LOST, None)
            with contextlib.suppress(Exception):
                conn.close()


def forget_lost_connection(exc: BaseException, using: str) -> bool:
    """If ``exc`` means the connection of ``using`` is lost for good
    (``Driver.is_connection_lost``), close it and return True; the next use reconnects. While
    a caller's ``atomic()`` block is still open on it, the block is marked for rollback and
    the connection is closed by the first ``close_lost_connections()`` after it (the worker
    calls it between messages). Never raises."""
    try:
        if not driver_for(using).is_connection_lost(exc):
            return False
        conn = connections[using]
        logger.warning("connection %r lost (%s); reconnecting", using, exc)
        driver_for(using).connection_lost()
        if conn.in_atomic_block:
            conn.needs_rollback = True
            conn.__dict__[_LOST] = True
        else:
            conn.__dict__.pop(_LOST, None)
            conn.close()
        return True
    except Exception:  # closing a dead connection may fail: it is dropped all the same
        logger.debug("closing the lost connection %r failed", using, exc_info=True)
        with contextlib.suppress(Exception):
            connections[using].connection = None
        return True


def recycle_connections() -> None:
    """Between messages: Django's ``close_old_connections()`` (close connections that are
    broken, left in a bad state, or older than ``CONN_MAX_AGE``), except that
    ``CONN_MAX_AGE = 0`` ("close after each request") keeps a healthy connection for the
    thread's life: a message is not a request, and reconnecting per message costs a new
    client per message (on Spanner a new client, session and maintenance thread each time).
    A connection found lost (``transactions.forget_lost_connection``) is closed."""
    close_lost_connections()
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.settings_dict.get("CONN_MAX_AGE") == 0:
            close_at, conn.close_at = conn.close_at, None
            try:
                conn.close_if_unusable_or_obsolete()
            finally:
                if conn.connection is not None:
                    conn.close_at = close_at
        else:
            conn.close_if_unusable_or_obsolete()


class ConnectionThread:
    """Long-lived daemon threads (at most ``size``) that run the calls given to them, in order
    of submission, each thread one at a time, on Django connections it keeps between them
    (``recycle_connections`` after each call: only a lost, broken or expired one is closed).
    For background reads that would otherwise open and close a connection each time (the stats
    cache, the ``/readyz`` database check): on Spanner every connection closed leaves its
    client's session-maintenance thread alive for good, so these reads cost at most ``size``
    threads and ``size`` connections per database alias however often they run. A thread
    starts when a call finds none free (up to ``size``) and lives as long as the process."""

    def __init__(self, name: str, size: int = 1) -> None:
        self.name = name
        self.size = max(1, size)
        self._lock = threading.Lock()
        self._calls: SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._free = 0  # threads waiting for a call
        self._pending = 0  # calls given and not yet over
        self._idle = threading.Condition(self._lock)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on one of the threads after the calls before it have started; its result
        or error in the returned ``Future``."""
        future: Future[T] = Future()
        with self._lock:
            self._pending += 1
            self._threads = [t for t in self._threads if t.is_alive()]
            if self._free < self._pending and len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._run, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._calls.put((fn, future))
        return future

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every call given so far has run; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._free += 1
            fn, future = self._calls.get()
            with self._lock:
                self._free -= 1
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:  # the caller's to handle
                        future.set_exception(exc)
                try:
                    recycle_connections()
                except Exception:  # closing a broken connection may fail: it is dropped
                    logger.debug("recycling %s's connections failed", self.name, exc_info=True)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()


def maintain_if_due(
    using: str, throttle: Throttle, every: float, task: Callable[[], object], what: str
) -> None:
    """Run ``task`` (upkeep of ``using``'s tables: a prune) if this process has not run it in
    the last ``every`` seconds (``throttle``, by database) and the caller is in no transaction;
    best effort: a failure is logged as ``what`` failing, never raised (the next one an
    interval later tries again)."""
    if connections[using].in_atomic_block or not throttle.due(using, every):
        return
    try:
        task()
    except Exception:
        logger.warning("%s of %r failed", what, using, exc_info=True)


def has_savepoints(using: str) -> bool:
    """Whether a transaction on ``using`` can roll back part of itself (``Driver.has_savepoints``:
    SQLite, PostgreSQL; not Spanner)."""
    return driver_for(using).has_savepoints


@contextlib.contextmanager
def savepoint(using: str, *, connection: BaseDatabaseWrapper | None = None) -> Iterator[None]:
    """A part of the open transaction on ``using`` that rolls back alone: Django's nested
    ``atomic(using)`` (``on_commit`` callbacks registered inside dropped with it, the same
    error handling), with three differences.

    - Its ``SAVEPOINT`` and ``RELEASE SAVEPOINT`` go to the DB-API cursor, past Django's cursor
      wrappers (errors still become Django's): the worker takes one per grouped receiver, and
      Django's cost for one was most of the worker's own time per message on SQLite. They are
      not in ``connection.queries`` nor seen by ``execute_wrapper``.
    - Its name is its depth (``sq_<n>``: unique among the savepoints open, as a name must be),
      not a new one each time: the statements' text repeats, so the driver's statement cache
      keeps them (and keeps the other statements of the hot path, which a new name each time
      pushed out of sqlite3's). Released, its name is taken off the ``on_commit`` callbacks
      registered inside it: they belong to the block around it, as Django's bookkeeping has
      it, and a later savepoint of the same name rolling back does not drop them.
    - Where a statement is a round trip (``Driver.releases_savepoints`` False: PostgreSQL) a
      savepoint that ends well is not released: the commit releases it with the others, and a
      later one of the same name nests in it (``ROLLBACK TO`` names the innermost).
    - A block that leaves the transaction marked for rollback without raising (it caught a
      database error of its own) is rolled back and raises ``TransactionManagementError``,
      where ``atomic()`` would exit quietly with its writes gone: the caller never takes that
      block for one whose writes will commit.

    Inside an ``atomic()`` block on a database with savepoints (``has_savepoints``); elsewhere
    (Spanner, no block open, or the transaction already marked for rollback) it is
    ``atomic(using)``."""
    conn = connection if connection is not None else connections[using]
    features = conn.features
    if (
        not conn.in_atomic_block
        or conn.needs_rollback
        or conn.connection is None
        or not (features.uses_savepoints and features.can_release_savepoints)
    ):
        with transaction.atomic(using=using):
            yield
        return
    sid = f"sq_{len(conn.savepoint_ids) + 1}"
    create, release = _savepoint_sql(conn, sid)
    cursor = _raw_cursor(conn)
    with conn.wrap_database_errors:
        cursor.execute(create)
    conn.savepoint_ids.append(sid)
    try:
        yield
    except BaseException:
        conn.savepoint_ids.pop()
        if not conn.closed_in_transaction:
            _roll_back_to(conn, sid)
        raise
    conn.savepoint_ids.pop()
    if conn.closed_in_transaction:
        return
    if conn.needs_rollback:
        _roll_back_to(conn, sid)
        raise TransactionManagementError(
            "the block caught a database error and went on: its transaction was marked for "
            "rollback, so its writes were rolled back"
        )
    if driver_of(conn).releases_savepoints:
        try:
            with conn.wrap_database_errors:
                cursor.execute(release)
        except DatabaseError:
            _roll_back_to(conn, sid)
            raise
    callbacks: list[Any] = conn.run_on_commit  # (sids, func, robust): django-stubs say two
    if callbacks:  # released: its callbacks are the enclosing block's now
        conn.run_on_commit = [(sids - {sid}, *rest) for sids, *rest in callbacks]


#: (the backend's operations class, savepoint name) -> its SAVEPOINT and RELEASE statements
_savepoint_statements: dict[tuple[type, str], tuple[str, str]] = {}


def _savepoint_sql(conn: BaseDatabaseWrapper, sid: str) -> tuple[str, str]:
    key = (type(conn.ops), sid)  # (as many names as savepoints nest: a handful)
    found = _savepoint_statements.get(key)
    if found is None:
        ops = conn.ops
        found = _savepoint_statements[key] = (
            ops.savepoint_create_sql(sid),
            ops.savepoint_commit_sql(sid),
        )
    return found


def _raw_cursor(conn: BaseDatabaseWrapper) -> Any:
    """A DB-API cursor of ``conn``'s open connection, kept for its savepoints (one a thread:
    each connection is one thread's), made again when the connection is."""
    raw = conn.connection
    kept = conn.__dict__.get("_spanner_queues_savepoint_cursor")
    if kept is None or kept[0] is not raw:
        kept = conn.__dict__["_spanner_queues_savepoint_cursor"] = (raw, raw.cursor())
    return kept[1]


def _roll_back_to(conn: Any, sid: str) -> None:
    """Roll back to savepoint ``sid`` and release it, as ``atomic()`` does on an error (the
    ``on_commit`` callbacks registered since are dropped); if that fails, the whole
    transaction is marked for rollback."""
    conn.needs_rollback = False
    try:
        conn.savepoint_rollback(sid)
        conn.savepoint_commit(sid)
    except Error:
        conn.needs_rollback = True


def single_writer(using: str) -> bool:
    """Whether one write lock serves every writer of ``using`` (``Driver.single_writer``:
    SQLite): a transaction holds it from its first write to its commit."""
    return driver_for(using).single_writer


def lost_race(exc: BaseException, using: str) -> bool:
    """Whether ``exc`` ends a transaction on ``using`` that ``run_in_transaction`` runs again
    from the start: a lost race (Spanner ABORTED, SQLite locked, a PostgreSQL serialization
    failure) or a lost connection."""
    driver = driver_for(using)
    return driver.is_retryable(exc) or driver.is_connection_lost(exc)


def run_in_transaction(fn: Callable[[], T], *, using: str, retries: int = 20) -> T:
    """Run ``fn`` in ``atomic(using=...)``; retry the whole transaction on retryable errors.

    In a caller's ``atomic()`` block ``fn`` runs once, in a ``savepoint``; if it fails with
    ``MessageAlreadyAcked`` or ``StaleAck`` the caller's transaction is marked for rollback
    (Spanner's rule on every database: a failed ack is never caught and continued). A lost
    connection is closed and, outside a caller's block, the transaction runs again on a new
    one (it counts as a retry)."""
    connection = connections[using]
    if connection.in_atomic_block:
        try:
            # (Spanner: no savepoint, the caller's transaction)
            with savepoint(using, connection=connection):
                return fn()
        except Exception as exc:
            forget_lost_connection(exc, using)
            if isinstance(exc, (MessageAlreadyAcked, StaleAck)):
                # The savepoint's rollback cleared the mark the engine set: the caller's
                # transaction must not commit as if the ack had happened.
                transaction.set_rollback(True, using=using)
            raise
    driver = driver_for(using)
    attempt = 0
    while True:
        try:
            # The driver's write lock (SQLite: one per database file, per process) is held for
            # one attempt, never across the back-off sleep nor around a caller's atomic block.
            with driver.write_lock(), transaction.atomic(using=using):
                return fn()
        except Exception as exc:
            lost = forget_lost_connection(exc, using)
            if lost:
                driver = driver_for(using)  # (the new connection's)
            if attempt >= retries or not (lost or driver.is_retryable(exc)):
                raise
            attempt += 1
            with _retries_lock:
                _retries[using] = _retries.get(using, 0) + 1
            delay = min(0.2, 0.002 * (2**attempt)) * (0.5 + random.random())
            logger.debug("transaction retry %d on %s after %r", attempt, using, exc)
            time.sleep(delay)


class Lock(Protocol):
    """A re-entrant lock (``threading.RLock``)."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


@contextlib.contextmanager
def holding(
    guard: Lock,
    write: Callable[[], T],
    *,
    using: str,
    retries: int = 20,
    wait: float | None = None,
) -> Iterator[tuple[bool, T | None]]:
    """Run ``write()`` holding ``guard``, a lock that other threads take inside their own
    read-write transactions on ``using``, and keep holding it for the ``with`` block, which
    yields ``(True, write's result)``. Errors of ``write()`` and of its transaction are raised
    by the ``with`` statement.

    The lock order is the database's. Where one write lock serves the whole database
    (``Driver.single_writer``: SQLite), ``write()`` runs in a read-write transaction of its own
    and ``guard`` is taken inside it, once the transaction has the database's lock (``BEGIN
    IMMEDIATE``): the order of the threads that take ``guard`` inside their transactions.
    Taken before, it would be held while waiting for the database (on every retry) by a thread
    that one holding the database's lock then waits for. ``wait``: give up when this process's
    write lock stays busy that long (a transaction of this process holds it): yields ``(False,
    None)`` and nothing is written. Elsewhere ``guard`` is simply held around ``write()``,
    which opens the transactions it needs."""
    driver = driver_for(using)
    if not driver.single_writer:
        guard.acquire()
        try:
            yield True, write()
        finally:
            guard.release()
        return
    held = False

    def attempt() -> T:
        nonlocal held
        if not held:  # (still held when only a commit failed: a retry keeps it)
            guard.acquire()
            held = True
        try:
            return write()
        except BaseException:
            guard.release()
            held = False
            raise

    try:
        with driver.write_lock(timeout=wait) as got:
            if not got and wait is not None:
                result: tuple[bool, T | None] = (False, None)
            else:
                result = (True, run_in_transaction(attempt, using=using, retries=retries))
        yield result
    finally:
        if held:
            guard.release()
