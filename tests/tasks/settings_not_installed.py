"""``tests.settings`` with ``TASKS`` naming the spanner_queues backend but without the
``spanner_queues.contrib.tasks`` app (nor ``tests.tasksapp``, whose queue model the settings
name) in ``INSTALLED_APPS``."""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [
    a for a in INSTALLED_APPS if a not in ("spanner_queues.contrib.tasks", "tests.tasksapp")
]
TASKS = {"default": {"BACKEND": "spanner_queues.contrib.tasks.QueueBackend"}}
