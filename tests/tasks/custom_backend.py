"""A project's own subclass of the backend (for the check E104)."""

from __future__ import annotations

from spanner_queues.contrib.tasks.backend import QueueBackend


class OwnQueueBackend(QueueBackend):
    pass
