"""``manage.py runqueueworker``, plus a heartbeat (pattern 10).

This app comes before ``spanner_queues`` in ``INSTALLED_APPS``, so this command replaces the
app's one (as ``staticfiles`` does with ``runserver``). It beats under ``--worker-id`` while the
worker runs, and deletes its heartbeat when the worker stops cleanly (first SIGTERM/SIGINT, or
the end of ``--burst``). If the process dies, the heartbeat is delivered ``TIMEOUT`` later to
``ops.receivers.worker_timed_out``.
"""

from __future__ import annotations

from typing import Any

from demo_project.ops.heartbeat import Heartbeat, new_worker_id
from spanner_queues.management.commands import runqueueworker


class Command(runqueueworker.Command):
    help = runqueueworker.Command.help + " Keeps a heartbeat in ops.WorkerHeartbeats."

    def handle(self, *args: Any, **options: Any) -> None:
        options["worker_id"] = options["worker_id"] or new_worker_id()
        with Heartbeat(options["worker_id"]):
            super().handle(*args, **options)
