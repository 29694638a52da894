"""``manage.py recordqueuedepth [QUEUE ...]``: store one depth sample per queue, for cron.

The admin's depth chart draws these samples; a worker serving metrics records them too
(``runqueueworker --metrics-port``), so this is for deployments without one.
"""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from spanner_queues.exceptions import QueueError
from spanner_queues.monitoring import record_depth_samples
from spanner_queues.queues import get_queue


class Command(BaseCommand):
    help = (
        "Store one QueueDepthSample per queue (default: every declared queue) for the admin's "
        "depth chart. Run it from cron, e.g. every minute."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="Queue labels or names.")
        parser.add_argument(
            "--min-interval",
            type=float,
            default=0.0,
            help="Skip a queue sampled less than this many seconds ago (default: never skip).",
        )

    def handle(self, *args: Any, **options: Any) -> None:

        try:
            queues = [get_queue(q) for q in options["queues"]] or None
            samples = record_depth_samples(
                queues,
                min_interval=timedelta(seconds=options["min_interval"])
                if options["min_interval"] > 0
                else None,
            )
        except (QueueError, DatabaseError) as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] >= 1:
            for sample in samples:
                self.stdout.write(
                    f"{sample.queue}: total {sample.total}, ready {sample.ready}, "
                    f"scheduled {sample.scheduled}, leased {sample.leased}"
                )
