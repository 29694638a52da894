"""``manage.py resumequeue QUEUE ...``: workers receive from these queues again within
``PAUSE_CHECK_SECONDS``."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from spanner_queues import controls
from spanner_queues.exceptions import QueueError
from spanner_queues.queues import get_queue


class Command(BaseCommand):
    help = "Resume paused queues for every worker."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("queues", nargs="+", metavar="QUEUE", help="Queue labels or names.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            for model in [get_queue(q) for q in options["queues"]]:
                state = "resumed" if controls.resume(model) else "was not paused"
                self.stdout.write(f"{model._meta.label}: {state}")
        except (QueueError, DatabaseError) as exc:
            raise CommandError(str(exc)) from exc
