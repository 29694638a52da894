"""``manage.py queuedrill``: the fault drill on this project's database (app
``spanner_queues.contrib.drill``; ``--pubsub``: relay and inbox workers of two services through
Pub/Sub, app ``spanner_queues.contrib.drill.pubsub``; ``--ordered``: numbered streams on an
ordered queue, or with ``--pubsub`` through an ordered outbox, Pub/Sub ordering keys and an
ordered inbox). Writes ``report.md``, ``depth.svg`` and ``report.json`` and exits 1 when a
message was lost, handled twice, or the queue did not drain (``--pubsub``: or was left in a
queue, in Pub/Sub or dead-lettered; ``--ordered``: or a stream ran out of order)."""

from __future__ import annotations

import math
import sys
from argparse import ArgumentParser, ArgumentTypeError
from pathlib import Path
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError

from spanner_queues import clock
from spanner_queues.contrib.drill.report import write_report
from spanner_queues.contrib.drill.runner import (
    ABORT_METHODS,
    SIGNALS,
    Drill,
    DrillError,
    DrillOptions,
    OrderedDrill,
)
from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.management.commands.runqueueworker import (
    non_negative_seconds,
    positive_int,
    positive_seconds,
)

#: the apps ``--pubsub`` needs beside the drill
PUBSUB_APPS = ("spanner_queues.contrib.pubsub", "spanner_queues.contrib.drill.pubsub")


def count(value: str) -> int:
    return 0 if value.strip() == "0" else positive_int(value)


def milliseconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a number of milliseconds") from None
    if not math.isfinite(number) or number < 0:
        raise ArgumentTypeError(f"must be 0 or more milliseconds, not {value}")
    return number


class Command(BaseCommand):
    help = (
        "Fault drill: send a batch to the drill queue, run runqueueworker child processes, "
        "SIGKILL them at random, optionally abort the database's transactions, drain, and "
        "write a report (messages sent, kills, aborts, handled, lost, handled twice, time to "
        "drain, depth chart). Exits 1 if anything was lost or handled twice."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        """The options, in one argument group per concern (their order in ``--help``)."""
        self._load_arguments(parser)
        self._fault_arguments(parser)
        self._run_arguments(parser)

    @staticmethod
    def _load_arguments(parser: ArgumentParser) -> None:
        load = parser.add_argument_group("The load: messages and workers")
        load.add_argument("--messages", type=positive_int, default=1000, help="(%(default)s)")
        load.add_argument(
            "--workers", type=positive_int, default=3, help="worker processes (%(default)s)"
        )
        load.add_argument(
            "--concurrency", type=positive_int, default=2, help="threads each (%(default)s)"
        )
        load.add_argument(
            "--work-ms",
            type=milliseconds,
            default=10.0,
            help="milliseconds each receiver sleeps before writing its effect (%(default)s)",
        )
        load.add_argument(
            "--lease",
            type=positive_seconds,
            default=5.0,
            help="the workers' --lease where the engine takes one (table engine); a killed "
            "worker's messages come back after it (%(default)s s)",
        )
        load.add_argument(
            "--pubsub",
            action="store_true",
            help="two services through Pub/Sub: relay workers publish service A's events, inbox "
            "workers pull them into service B, where each writes its effect; --workers of each, "
            "killed alike. Needs the Pub/Sub emulator (PUBSUB_EMULATOR_HOST) or real Pub/Sub, "
            "and the apps " + " and ".join(PUBSUB_APPS),
        )
        load.add_argument(
            "--ordered",
            action="store_true",
            help="an ordered queue (QueueMeta.ordered_by): --messages numbered in --streams "
            "ordering keys; checks each stream ran in send order, one at a time, each message "
            "once (no gap, no inversion, no double). With --pubsub: an ordered outbox relayed "
            "with Pub/Sub ordering keys to an ordered inbox, each stream checked at the inbox's "
            "receiver",
        )
        load.add_argument(
            "--streams",
            type=positive_int,
            default=10,
            help="--ordered: ordering keys the messages are spread over (%(default)s)",
        )
        load.add_argument(
            "--worker-arg",
            action="append",
            default=[],
            help="extra argument for each runqueueworker (repeat), e.g. --worker-arg=--prefetch=1",
        )

    @staticmethod
    def _fault_arguments(parser: ArgumentParser) -> None:
        faults = parser.add_argument_group("The faults: kills and aborts")
        faults.add_argument(
            "--kills",
            type=count,
            default=5,
            help="workers SIGKILLed at random points of the drain, each replaced by a new one "
            "(%(default)s)",
        )
        faults.add_argument(
            "--signal",
            choices=SIGNALS,
            default="kill",
            help="what a kill point sends its worker: kill (SIGKILL), term (SIGTERM: it drains "
            "and exits) or mixed (either, by the seed) (%(default)s)",
        )
        faults.add_argument(
            "--abort-method",
            choices=ABORT_METHODS,
            default="none",
            help="pg-terminate: end the drill workers' PostgreSQL sessions "
            "(pg_terminate_backend, by application_name; needs superuser or "
            "pg_signal_backend); command: run --abort-command (e.g. a local server restart)",
        )
        faults.add_argument(
            "--abort-every",
            type=non_negative_seconds,
            default=0.0,
            help="seconds between aborts, jittered 0.5x-1.5x (0: none)",
        )
        faults.add_argument("--abort-command", default="", help="shell command for 'command'")
        faults.add_argument(
            "--seed",
            type=int,
            default=None,
            help="random seed of the kills and aborts (default: drawn, and recorded in the report)",
        )

    @staticmethod
    def _run_arguments(parser: ArgumentParser) -> None:
        run = parser.add_argument_group("The run and its report")
        run.add_argument(
            "--timeout",
            type=positive_seconds,
            default=600.0,
            help="give up draining after this many seconds; an --abort-command still running "
            "then is ended (%(default)s)",
        )
        run.add_argument(
            "--sample-interval",
            type=positive_seconds,
            default=0.5,
            help="seconds between depth samples (%(default)s)",
        )
        run.add_argument(
            "--report-dir",
            default=None,
            help="where to write the report (default: ./queuedrill-<UTC time>)",
        )
        run.add_argument(
            "--keep-effects",
            action="store_true",
            help="keep this run's rows in sq_drill_effects (default: deleted once counted)",
        )
        run.add_argument(
            "--allow-shared-database",
            action="store_true",
            help="run on a database that holds other apps' rows (refused by default: the "
            "drill loads the database, and on SQLite it stalls every other writer)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report_dir = Path(
            options["report_dir"] or f"queuedrill-{clock.now():%Y%m%d-%H%M%S}"
        ).resolve()
        drill_options = DrillOptions(
            messages=options["messages"],
            workers=options["workers"],
            concurrency=options["concurrency"],
            kills=options["kills"],
            lease=options["lease"],
            work_ms=options["work_ms"],
            abort_every=options["abort_every"],
            abort_method=options["abort_method"],
            abort_command=options["abort_command"],
            timeout=options["timeout"],
            sample_interval=options["sample_interval"],
            keep_effects=options["keep_effects"],
            seed=options["seed"],
            worker_args=tuple(options["worker_arg"]),
            allow_shared_database=options["allow_shared_database"],
            pubsub=options["pubsub"],
            signal=options["signal"],
            ordered=options["ordered"],
            streams=options["streams"],
        )
        verbose = options["verbosity"] >= 1

        def log(line: str) -> None:
            if verbose:
                self.stdout.write(line)
                sys.stdout.flush()

        try:
            drill = (
                _pubsub_drill(ordered=drill_options.ordered)
                if drill_options.pubsub
                else OrderedDrill
                if drill_options.ordered
                else Drill
            )
            result = drill(drill_options, report_dir, log=log).run()
        except DrillError as exc:
            raise CommandError(str(exc)) from exc
        path = write_report(result, report_dir, ["manage.py", "queuedrill", *_argv(result.options)])
        self.stdout.write(
            f"{'PASS' if result.passed else 'FAIL'}: sent={result.sent} kills={result.kills} "
            f"aborts={result.aborts} handled={result.handled} lost={result.lost} "
            f"twice={result.twice} drain={result.drain_seconds:.2f}s"
            + (
                f" published={result.published} duplicates_dropped={result.duplicates_dropped}"
                f" left={result.left_in_queue + (result.left_on_subscription or 0)}"
                if result.mode == "pubsub"
                else ""
            )
            + (
                f" order_violations={len(result.order_violations)}"
                if result.options.ordered
                else ""
            )
            + f" report={path}"
        )
        if not result.passed:
            why = "did not drain" if not result.drained else "lost or handled twice"
            if result.drained and not (result.lost or result.twice):
                why = "a message was left in a queue, in Pub/Sub or dead-lettered"
            if result.drained and result.order_violations and not (result.lost or result.twice):
                why = "a stream ran out of order"
            raise CommandError(f"fault drill failed ({why}): see {path}")


def _pubsub_drill(*, ordered: bool = False) -> type[Drill]:
    """The Pub/Sub mode's drill (``ordered``: its ordered drill); ``DrillError`` naming what
    to install when it cannot run."""
    missing = [app for app in PUBSUB_APPS if not apps.is_installed(app)]
    if missing:
        raise DrillError(
            f"--pubsub needs {' and '.join(missing)} in INSTALLED_APPS (then manage.py migrate "
            "spanner_queues_drill_pubsub); see docs/howto/fault-drill.md"
        )
    try:
        # the optional app's runner needs google-cloud-pubsub (the `pubsub` extra)
        from spanner_queues.contrib.drill.pubsub.runner import OrderedPubSubDrill, PubSubDrill
    except (ImportError, QueueConfigurationError) as exc:
        raise DrillError(f"--pubsub needs pip install 'spanner-queues[pubsub]' ({exc})") from exc
    return OrderedPubSubDrill if ordered else PubSubDrill


def _argv(o: DrillOptions) -> list[str]:
    """The options of this run, spelled out (the report's command to run it again)."""
    argv = [
        f"--messages={o.messages}",
        f"--workers={o.workers}",
        f"--concurrency={o.concurrency}",
        f"--kills={o.kills}",
        f"--lease={o.lease:g}",
        f"--work-ms={o.work_ms:g}",
    ]
    if o.abort_method != "none":
        argv += [f"--abort-method={o.abort_method}", f"--abort-every={o.abort_every:g}"]
    if o.abort_command:
        argv.append(f"--abort-command={o.abort_command}")
    if o.pubsub:
        argv.append("--pubsub")
    if o.ordered:
        argv += ["--ordered", f"--streams={o.streams}"]
    if o.signal != "kill":
        argv.append(f"--signal={o.signal}")
    argv += [f"--timeout={o.timeout:g}"]
    if o.seed is not None:
        argv.append(f"--seed={o.seed}")
    argv += [f"--worker-arg={arg}" for arg in o.worker_args]
    if o.allow_shared_database:
        argv.append("--allow-shared-database")
    return argv
