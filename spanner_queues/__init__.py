"""spanner_queues: a transactional outbox for Django on Google Cloud Spanner queues.

Declare queues with ``spanner_queues.models.Queue``; send with ``MyQueue.send(...)`` inside your
own ``transaction.atomic()`` block. The public modules and their names are listed in
``docs/reference/api.md`` ("Public modules"); every other module is private.
"""

from __future__ import annotations

from spanner_queues.exceptions import QueueError, Retry
from spanner_queues.receivers import receiver

__all__ = ["QueueError", "Retry", "__version__", "receiver"]
__version__ = "0.1.0"
