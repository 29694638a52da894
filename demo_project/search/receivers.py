"""The reindexer: a batch receiver, so a burst of dirty flags costs one transaction."""

from __future__ import annotations

from demo_project.search.models import ReindexQueue
from demo_project.search.services import reindex
from spanner_queues import receiver
from spanner_queues.message import Message


@receiver(ReindexQueue, batch=True, max_batch_size=50)
def reindex_dirty_users(messages: list[Message]) -> None:
    """Pattern 9: recompute every flagged user; the batch is acked with these writes."""
    reindex(m.key_dict["user_id"] for m in messages)
