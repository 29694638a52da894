"""Transaction retries of a drill worker process, for the effect rows' ``retries`` column.

Two places run an aborted transaction again: ``spanner_queues.transactions.run_in_transaction``
(counted by ``retry_counts()``), and, on Spanner, the DB-API under django_spanner, which replays
an aborted transaction's statements by itself before anything reaches the caller. The second is
counted only in the drill's own worker processes: ``install()`` wraps the DB-API's replay when
the environment has ``SQ_DRILL_WORKER`` (set by ``queuedrill`` for its children), and is a
no-op elsewhere or without google-cloud-spanner.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from spanner_queues.transactions import retry_counts

_replays = 0
_lock = threading.Lock()
_installed = False


def install() -> bool:
    """Count the DB-API's replays of aborted transactions in this process (drill workers
    only); whether the count is on."""
    global _installed
    if _installed or not os.environ.get("SQ_DRILL_WORKER"):
        return _installed
    try:  # google-cloud-spanner is optional (and slow to import): only drill workers need it
        from google.cloud.spanner_dbapi.transaction_helper import TransactionRetryHelper
    except ImportError:
        return False
    original = getattr(TransactionRetryHelper, "retry_transaction", None)
    if original is None:  # another google-cloud-spanner: no count, the drill still runs
        return False

    @functools.wraps(original)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _replays
        with _lock:
            _replays += 1
        return original(self, *args, **kwargs)

    TransactionRetryHelper.retry_transaction = counted
    _installed = True
    return True


def retries() -> int:
    """Transactions run again in this process so far: by ``run_in_transaction`` and (drill
    workers on Spanner) replayed by the DB-API."""
    with _lock:
        replays = _replays
    return sum(retry_counts().values()) + replays
