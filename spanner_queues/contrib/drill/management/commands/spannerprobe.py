"""``manage.py spannerprobe``: ask the Spanner instance behind a native engine alias the
questions Google leaves open (``spanner_queues.contrib.drill.probe``), on scratch queues it
creates and drops; print each answer and whether the engine's rule holds for it, and write
the report as JSON (attach it to a bug)."""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from spanner_queues.contrib.drill.probe import CHECKS, Probe, ProbeRefused
from spanner_queues.engines import engines
from spanner_queues.exceptions import QueueConfigurationError


class Command(BaseCommand):
    help = (
        "Ask a Spanner instance what Google's documentation leaves open (DeliverTime on lease "
        "and redelivery, the back-off after an unread lease, a 1 ms RECEIVE under a backlog, "
        "rows stranded by a cancelled call, RetryInfo on ABORTED, sessions, PARSE_JSON on "
        "floats, the PostgreSQL names, RECEIVE calls per message) on scratch queues it creates "
        "and drops; print the answers and whether the engine's rules hold; write a JSON report."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--engine", default="default", help="the SPANNER_QUEUES alias (a native engine)"
        )
        parser.add_argument(
            "--queue",
            default=None,
            help="the scratch queue's name (default: spannerprobe_<random>); the probe refuses "
            "a name that exists",
        )
        parser.add_argument(
            "--check",
            action="append",
            choices=CHECKS,
            dest="checks",
            help="run only this check (repeatable; default: all)",
        )
        parser.add_argument(
            "--report",
            default="spannerprobe.json",
            help="where to write the JSON report (default: spannerprobe.json)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            engine = engines[options["engine"]]
        except (KeyError, QueueConfigurationError) as exc:
            raise CommandError(f"no engine {options['engine']!r}: {exc}") from exc
        try:
            probe = Probe(
                engine,
                options["queue"],
                checks=tuple(options["checks"] or CHECKS),
                log=lambda line: self.stderr.write(line),
            )
            report = probe.run()
        except ProbeRefused as exc:
            raise CommandError(str(exc)) from exc
        for line in report.lines():
            self.stdout.write(line)
        path = Path(options["report"])
        path.write_text(report.as_json())
        self.stdout.write(f"report: {path}")
