"""``manage.py pausequeue QUEUE ... [--reason TEXT]``; ``--list`` shows what is paused.

Every worker stops receiving from a paused queue within ``PAUSE_CHECK_SECONDS`` and starts again
by itself after ``manage.py resumequeue``; sends are still accepted meanwhile.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from spanner_queues import controls
from spanner_queues.exceptions import QueueError
from spanner_queues.queues import get_queue, queue_models


class Command(BaseCommand):
    help = "Pause queues for every worker (persisted); --list shows the paused queues."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="Queue labels or names.")
        parser.add_argument("--reason", default="", help="Shown in the admin and by --list.")
        parser.add_argument("--list", action="store_true", help="List the paused queues.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["list"]:
                if options["queues"]:
                    raise CommandError("--list takes no queue.")
                for row in sorted(controls.paused(queue_models()).values(), key=str):
                    reason = f": {row.reason}" if row.reason else ""
                    self.stdout.write(f"{row}{reason}")
                return
            if not options["queues"]:
                raise CommandError("Name the queues to pause (or --list).")
            for model in [get_queue(q) for q in options["queues"]]:
                done = controls.pause(model, reason=options["reason"])
                state = "paused" if done else "already paused"
                self.stdout.write(f"{model._meta.label}: {state}")
        except (QueueError, DatabaseError) as exc:
            raise CommandError(str(exc)) from exc
