"""``manage.py generate_traffic``: simulated users, until Ctrl-C or ``--duration``."""

from __future__ import annotations

import signal
import threading
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from demo_project.traffic.generator import TrafficGenerator


class Command(BaseCommand):
    help = "Generate demo traffic (sign-ups, orders, uploads, profile edits, reports)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--rate", type=float, default=4.0, help="Actions a second.")
        parser.add_argument("--duration", type=float, default=None, help="Stop after seconds.")
        parser.add_argument("--seed", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        if options["duration"]:
            timer = threading.Timer(options["duration"], stop.set)
            timer.daemon = True
            timer.start()
        TrafficGenerator(rate=options["rate"], seed=options["seed"], write=self.stdout.write).run(
            stop
        )
