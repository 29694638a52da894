"""``tests.settings`` with the tasks.md settings block pasted into a project without the
``shop`` app (``QUEUE_MODELS`` names an undeclared queue) and wrong option values."""

from __future__ import annotations

from tests.settings import *  # noqa: F403

TASKS = {
    "default": {
        "BACKEND": "spanner_queues.contrib.tasks.QueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "QUEUE_MODELS": {"emails": "shop.EmailTasks"},
            "RESULT_RETENTION_SECONDS": "a week",
            "ATOMIC_TASK": True,
        },
    }
}
