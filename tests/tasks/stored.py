"""Helpers of the Tasks tests that change a task as stored (its message; queue rows refuse
UPDATE, so the message is sent again under its key)."""

from __future__ import annotations

import json
from typing import Any

from spanner_queues import api
from spanner_queues.contrib.tasks.models import TaskMessage


def restore_task(result_id: str, **changes: Any) -> dict[str, Any]:
    """Send the message of task ``result_id`` again with ``changes`` to its payload (e.g.
    ``task=`` a path that names no task in this process); return the payload."""
    row = TaskMessage.objects.get(id=result_id)
    payload = {**json.loads(row.payload), **changes}
    TaskMessage.objects.filter(id=result_id).delete()
    api.send(TaskMessage, payload=payload, id=result_id)
    return payload
