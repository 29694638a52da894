"""spanner_queues: a transactional outbox for Django on Google Cloud Spanner queues.

Declare queues with ``spanner_queues.models.Queue``; send with ``MyQueue.send(...)`` inside your
own ``transaction.atomic()`` block.
"""

from __future__ import annotations

from typing import Any

from spanner_queues.exceptions import QueueError, Retry

__all__ = ["QueueError", "Retry", "__version__", "receiver"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # ``from spanner_queues import receiver``, without importing models before apps are ready.
    if name == "receiver":
        from spanner_queues.receivers import receiver

        return receiver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
