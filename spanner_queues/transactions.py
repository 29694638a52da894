"""Short read-write transactions with retry on the errors a driver calls retryable.

Spanner aborts transactions that lose a race, and SQLite reports "database is locked"; both are
safe to run again from the start. Inside a caller's ``atomic()`` block nothing can be retried
(there are no savepoints on Spanner), so the function runs once, in the caller's transaction.

Outside one, each attempt runs under the driver's ``write_lock()`` (SQLite: threads of this
process queue for the database file's single write lock in Python instead of sleeping in
SQLite's busy handler; elsewhere nothing).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import connections, transaction

from spanner_queues.drivers import driver_for
from spanner_queues.exceptions import MessageAlreadyAcked, StaleAck

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


def run_in_transaction(fn: Callable[[], T], *, using: str, retries: int = 20) -> T:
    """Run ``fn`` in ``atomic(using=...)``; retry the whole transaction on retryable errors.

    In a caller's ``atomic()`` block ``fn`` runs once; if it fails with ``MessageAlreadyAcked`` or
    ``StaleAck`` the caller's transaction is marked for rollback (Spanner's rule on every
    database: a failed ack is never caught and continued)."""
    if connections[using].in_atomic_block:
        try:
            with transaction.atomic(using=using):
                return fn()
        except (MessageAlreadyAcked, StaleAck):
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
            if attempt >= retries or not driver.is_retryable(exc):
                raise
            attempt += 1
            with _retries_lock:
                _retries[using] = _retries.get(using, 0) + 1
            delay = min(0.2, 0.002 * (2**attempt)) * (0.5 + random.random())
            logger.debug("transaction retry %d on %s after %r", attempt, using, exc)
            time.sleep(delay)
