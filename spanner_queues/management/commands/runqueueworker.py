"""``manage.py runqueueworker [QUEUE ...]``: a thin adapter over ``spanner_queues.worker.Worker``.

Configuration errors (unknown queue, receiver for an undeclared queue, no receivers) end the
command with a clear message and exit status 1 before any message is received.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError

from spanner_queues.checks import METRICS_APP
from spanner_queues.conf import MIN_SAMPLE_INTERVAL
from spanner_queues.engines.stats import STATS_MAX_AGE_SECONDS, stats_cache
from spanner_queues.exceptions import BurstFailed, QueueError, WorkerCrashed, WorkerStuck
from spanner_queues.worker import (
    FINAL_EVENTS,
    MAX_CONCURRENCY,
    MAX_PREFETCH,
    Worker,
    WorkerEvent,
    WorkerStats,
)
from spanner_queues.worker.group import (
    DEFAULT_GROUP_MS,
    DEFAULT_GROUP_MS_MANY_WRITERS,
    DEFAULT_GROUP_SIZE,
    DEFAULT_GROUP_SIZE_SINGLE_WRITER,
    MAX_GROUP_SIZE,
)
from spanner_queues.worker.health import WorkerHealth, serve

if TYPE_CHECKING:
    from spanner_queues.contrib.metrics.apps import MetricsConfig

logger = logging.getLogger("spanner_queues.worker")

#: seconds the summary line printed at stop waits for the depth read after the work ended
FINAL_DEPTH_WAIT_SECONDS = 2.0


@contextlib.contextmanager
def console_logging(verbosity: int) -> Iterator[None]:
    """While the command runs, the ``spanner_queues`` loggers write to stderr (INFO and up;
    DEBUG at -v3) as ``runserver``'s ``django.server`` lines do, when nothing would show them
    otherwise: at -v1 and above, and only if no handler is configured on ``spanner_queues``,
    on any logger below it, nor on the root logger (a project's ``LOGGING`` that writes them
    already gets no second copy)."""

    logger = logging.getLogger("spanner_queues")
    below = [
        other
        for name, other in logging.root.manager.loggerDict.items()
        if name.startswith("spanner_queues.") and isinstance(other, logging.Logger)
    ]
    if verbosity < 1 or logger.hasHandlers() or any(other.handlers for other in below):
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[{asctime}] {message}", style="{", datefmt="%d/%b/%Y %H:%M:%S")
    )
    level = logging.DEBUG if verbosity >= 3 else logging.INFO
    handler.setLevel(level)
    before = logger.level
    logger.addHandler(handler)
    if before == logging.NOTSET:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def bounded_int(high: int) -> Callable[[str], int]:
    """An argparse type: an int from 1 to ``high``."""

    def parse(value: str) -> int:
        number = positive_int(value)
        if number > high:
            raise ArgumentTypeError(
                f"must be at most {high}, not {number} (each receiver thread holds a database "
                "connection; run more worker processes instead)"
            )
        return number

    return parse


def positive_seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or number <= 0:
        raise ArgumentTypeError(f"must be a positive number of seconds, not {value}")
    return number


def sample_seconds(value: str) -> float:
    """``--metrics-interval``: at least ``MIN_SAMPLE_INTERVAL`` (each round reads every queue's
    stats and stores depth samples)."""

    number = positive_seconds(value) if value.strip() not in ("0", "0.0") else 0.0
    if number < MIN_SAMPLE_INTERVAL:
        raise ArgumentTypeError(f"must be at least {MIN_SAMPLE_INTERVAL:g} s, not {value}")
    return number


def non_negative_seconds(value: str) -> float:
    if value.strip() in ("0", "0.0"):
        return 0.0
    return positive_seconds(value)


def port_number(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= number <= 65535:
        raise ArgumentTypeError(f"must be a port from 0 to 65535, not {number}")
    return number


def worker_id(value: str) -> str:
    if not value or len(value) > 64 or not value.isprintable() or " " in value:
        raise ArgumentTypeError("must be 1-64 printable characters without spaces")
    return value


def _commits(stats: WorkerStats) -> str:
    """``commits/msg=0.05 group=19.8 `` (run commits per message processed, messages per
    group), once messages were processed."""
    if not stats.processed:
        return ""
    group = f" group={stats.grouped / stats.groups:.1f}" if stats.groups else ""
    return f"commits/msg={stats.commits / stats.processed:.2f}{group} "


class Command(BaseCommand):
    help = (
        "Receive messages from queues and run their receivers. With no QUEUE, every queue that "
        "has a receiver. First SIGTERM/SIGINT: finish in-flight messages and exit 0; a second "
        "one exits at once (unacked messages are delivered again after their lease)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        """The options, in one argument group per concern (their order in ``--help``)."""
        parser.add_argument(
            "queues",
            nargs="*",
            metavar="QUEUE",
            help="Queue labels (app_label.ModelName) or names; default: all with receivers.",
        )
        self._intake_arguments(parser)
        self._stop_arguments(parser)
        self._lease_arguments(parser)
        self._logging_arguments(parser)
        self._metrics_arguments(parser)
        self._health_arguments(parser)

    @staticmethod
    def _intake_arguments(parser: ArgumentParser) -> None:
        receiving = parser.add_argument_group("What to receive, and how much at once")
        receiving.add_argument(
            "--concurrency",
            type=bounded_int(MAX_CONCURRENCY),
            default=1,
            help="Receiver threads in this process (default: %(default)s).",
        )
        receiving.add_argument(
            "--prefetch",
            type=bounded_int(MAX_PREFETCH),
            default=None,
            help="Messages each thread may hold: one receive claims up to CONCURRENCY x "
            "PREFETCH minus those held, each then processed and acked in its own "
            "transaction; unstarted ones are given back at stop. 1 claims only for free "
            "threads. Default: adaptive (one per free thread; up to 100 while a backlog and "
            "quick receivers allow, never more than a thread starts within 0.25 s or half "
            "the lease).",
        )
        receiving.add_argument(
            "--batch-size",
            type=positive_int,
            default=10,
            help="Most messages one receive asks for (never more than free threads, except "
            "for batch receivers, which take up to this many in one thread) "
            "(default: %(default)s).",
        )
        receiving.add_argument(
            "--group-size",
            type=bounded_int(MAX_GROUP_SIZE),
            default=None,
            help="Most messages whose receivers run in one transaction with one commit (group "
            "commit; 1: each message alone). A queue's QueueMeta.group_size overrides it "
            f"(default: {DEFAULT_GROUP_SIZE_SINGLE_WRITER} on SQLite, {DEFAULT_GROUP_SIZE} "
            "elsewhere).",
        )
        receiving.add_argument(
            "--group-ms",
            type=positive_seconds,
            default=None,
            help="Milliseconds of receiver time after which a group commits, whichever of it "
            "and --group-size comes first; a queue's QueueMeta.group_ms overrides it "
            f"(default: {DEFAULT_GROUP_MS:g} on SQLite, whose write lock a group holds; "
            f"{DEFAULT_GROUP_MS_MANY_WRITERS:g} elsewhere).",
        )
        receiving.add_argument(
            "--poll-interval",
            type=non_negative_seconds,
            default=0.05,
            help="Seconds between receives when nothing is due, jittered down to half "
            "(default: %(default)s).",
        )

    @staticmethod
    def _stop_arguments(parser: ArgumentParser) -> None:
        stopping = parser.add_argument_group("When to stop")
        stopping.add_argument(
            "--burst",
            action="store_true",
            help="Process every message that is due now, then exit 0 (cron, tests); a queue "
            "that fails every receive for 60 s (a missing table, a database down) ends it "
            "with status 1.",
        )
        stopping.add_argument(
            "--max-messages",
            type=positive_int,
            default=None,
            help="Exit 0 after receiving this many messages (and finishing them).",
        )

    @staticmethod
    def _lease_arguments(parser: ArgumentParser) -> None:
        leases = parser.add_argument_group("Leases and time limits")
        leases.add_argument(
            "--lease",
            type=positive_seconds,
            default=None,
            help="Lease in seconds on each received message (default: the engine's, "
            "LEASE_SECONDS). Leases are renewed in the background while receivers run.",
        )
        leases.add_argument(
            "--timeout",
            type=positive_seconds,
            default=None,
            help="Time limit in seconds of each receiver run, for receivers that set none "
            "(@receiver(timeout=...)): past it the run is interrupted, counts as a failed "
            "attempt and its message goes back to the queue. A receiver that cannot be "
            "interrupted makes the worker exit with status 3 (default: no limit).",
        )
        leases.add_argument(
            "--stuck-grace",
            type=positive_seconds,
            default=10.0,
            help="Seconds a receiver may stay busy past its time limit before the worker gives "
            "up on it and exits with status 3 (default: %(default)s).",
        )

    @staticmethod
    def _logging_arguments(parser: ArgumentParser) -> None:
        logging = parser.add_argument_group("Logs")
        logging.add_argument(
            "--summary-interval",
            type=positive_seconds,
            default=10.0,
            help="Seconds between summary lines at -v1 and above (default: %(default)s).",
        )
        logging.add_argument(
            "--worker-id",
            type=worker_id,
            default=None,
            help="Name of this worker in logs (default: host-pid-random).",
        )

    @staticmethod
    def _metrics_arguments(parser: ArgumentParser) -> None:
        metrics = parser.add_argument_group(
            "Prometheus metrics (the app spanner_queues.contrib.metrics)"
        )
        metrics.add_argument(
            "--metrics-port",
            type=port_number,
            default=None,
            help="Serve Prometheus metrics at http://METRICS_ADDR:PORT/metrics (needs the "
            "app spanner_queues.contrib.metrics and the 'metrics' extra). Each worker on a host "
            "needs its own port; 0 picks a free one (printed at start).",
        )
        metrics.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            help="Address the metrics server listens on (default: %(default)s; 0.0.0.0 for "
            "every interface).",
        )
        metrics.add_argument(
            "--metrics-interval",
            type=sample_seconds,
            default=None,
            help="Seconds between reads of the queue gauges (and depth samples), at least 1 "
            "(default: SPANNER_QUEUES_METRICS['SAMPLE_INTERVAL_SECONDS'], 30).",
        )

    @staticmethod
    def _health_arguments(parser: ArgumentParser) -> None:
        health = parser.add_argument_group("Health probes (/livez, /readyz)")
        health.add_argument(
            "--health-port",
            type=port_number,
            default=None,
            help="Serve the probes /livez and /readyz at http://HEALTH_ADDR:PORT on a port of "
            "their own (no 'metrics' extra needed); 0 picks a free one (printed at start). "
            "With --metrics-port they are served on the metrics port too.",
        )
        health.add_argument(
            "--health-addr",
            default="127.0.0.1",
            help="Address the health server listens on (default: %(default)s; 0.0.0.0 for "
            "a kubelet's probes).",
        )
        health.add_argument(
            "--health-max-run",
            type=positive_seconds,
            default=None,
            help="/livez fails while a receiver has run longer than this many seconds "
            "(default: no limit).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with console_logging(options["verbosity"]):
            self._handle(options)

    def _handle(self, options: dict[str, Any]) -> None:
        verbosity: int = options["verbosity"]
        self._verbosity = verbosity
        self._last: tuple[float, int] = (time.monotonic(), 0)
        lease = options["lease"]
        # no listener at -v0: the worker then builds no event objects at all
        listeners: list[Callable[[WorkerEvent], None]] = [self._on_event] if verbosity else []
        sampler = None
        health = None
        if options["metrics_port"] is not None or options["health_port"] is not None:
            health = self._start_health(options, listeners)
        if options["metrics_port"] is not None:
            sampler = self._start_metrics(options, listeners, health)
        try:
            worker = Worker(
                options["queues"] or None,
                concurrency=options["concurrency"],
                prefetch=options["prefetch"],
                batch_size=options["batch_size"],
                burst=options["burst"],
                max_messages=options["max_messages"],
                lease=timedelta(seconds=lease) if lease else None,
                poll_interval=options["poll_interval"],
                timeout=options["timeout"],
                stuck_grace=options["stuck_grace"],
                worker_id=options["worker_id"],
                listeners=listeners,
                summary_interval=options["summary_interval"] if verbosity >= 1 else None,
                group_size=options["group_size"],
                group_ms=options["group_ms"],
            )
        except (QueueError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self._worker = worker
        if health is not None:
            health.attach(worker)
        if verbosity >= 1:
            self._announce(worker, burst=options["burst"])
        self._run(worker, sampler, health)

    def _announce(self, worker: Worker, *, burst: bool) -> None:
        """The start line (at ``-v1`` and above); the first summary line finds its depths
        read."""
        mode = " (burst)" if burst else ""
        self.stdout.write(
            f"runqueueworker {worker.worker_id}: queues {', '.join(worker.queue_labels)}; "
            f"concurrency {worker.concurrency}"
            + (
                ", prefetch adaptive"
                if worker.prefetch is None
                else f", prefetch {worker.prefetch}"
            )
            + mode
        )
        for plan in worker.plans:
            stats_cache.peek(plan.model, max_age=self._depth_max_age())

    def _run(self, worker: Worker, sampler: Any, health: WorkerHealth | None = None) -> None:
        """Run ``worker`` beside the installed apps' services (a service's ``problems()``, where
        it has one, is a readiness check of ``health``); stop them, and the metrics
        ``sampler``, after it. A crashed worker is a ``CommandError`` (exit status 1); a stuck
        one leaves the process at once with status 3."""
        services = self._app_services(worker)
        if health is not None:
            for service in services:
                problems = getattr(service, "problems", None)
                if problems is not None:
                    health.add_readiness_check(problems)
        try:
            for service in services:
                service.start()
            worker.run()
        except WorkerCrashed as exc:  # logged with its traceback by the worker; exit status 1
            raise CommandError(str(exc)) from exc
        except BurstFailed as exc:  # a queue failed every receive of a burst: exit status 1
            raise CommandError(str(exc)) from exc
        except WorkerStuck as exc:
            # A thread is stuck in a receiver (it may hold a database lock): leave at once,
            # status 3, so that the supervisor restarts the process.
            self.stderr.write(f"runqueueworker: {exc}")
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(3)
        finally:
            for service in services:
                service.stop()
            if sampler is not None:
                sampler.stop()

    def _app_services(self, worker: Worker) -> list[Any]:
        """The seam for optional apps: each installed app whose ``AppConfig`` has a
        ``worker_services(worker)`` method gives the background services that run beside this
        worker (objects with ``start()`` and ``stop()``; ``stop()`` returns once the service
        has ended): the Pub/Sub app's inbox pullers. Started before the worker runs, stopped
        after it returned. The worker itself knows nothing of them."""
        services: list[Any] = []
        for config in apps.get_app_configs():
            hook = getattr(config, "worker_services", None)
            if hook is not None:
                try:
                    services.extend(hook(worker))
                except QueueError as exc:
                    raise CommandError(str(exc)) from exc
        return services

    def _start_health(
        self, options: dict[str, Any], listeners: list[Callable[[WorkerEvent], None]]
    ) -> Any:
        """The probes' state (a listener); served on --health-port when given (and on the
        metrics port by ``_start_metrics``)."""

        health = WorkerHealth(max_run_seconds=options["health_max_run"])
        listeners.append(health)
        if options["health_port"] is not None:
            addr = options["health_addr"]
            try:
                _server, port = serve(options["health_port"], addr, health)
            except OSError as exc:
                raise CommandError(
                    f"cannot serve health probes on {addr}:{options['health_port']}: {exc} "
                    "(give each worker on a host its own --health-port, or 0 for a free one)"
                ) from exc
            self.stdout.write(f"health on http://{addr}:{port}/livez and /readyz")
            sys.stdout.flush()
        return health

    def _start_metrics(
        self,
        options: dict[str, Any],
        listeners: list[Callable[[WorkerEvent], None]],
        health: Any = None,
    ) -> Any:
        """Serve /metrics (and the probes), count the worker's events, and start the sampler
        of the queue gauges (and depth samples): what the metrics app's ``worker_metrics``
        gives (this command never imports the app)."""

        if not apps.is_installed(METRICS_APP):
            raise CommandError(
                f"--metrics-port needs the metrics app: add {METRICS_APP!r} to INSTALLED_APPS "
                "(and pip install 'spanner-queues[metrics]')."
            )
        config = cast("MetricsConfig", apps.get_app_config("spanner_queues_metrics"))
        try:
            app, listener, sampler = config.worker_metrics(options["metrics_interval"])
            _server, port = serve(options["metrics_port"], options["metrics_addr"], health, app)
        except QueueError as exc:
            raise CommandError(str(exc)) from exc
        except OSError as exc:
            raise CommandError(
                f"cannot serve metrics on {options['metrics_addr']}:{options['metrics_port']}: "
                f"{exc} (give each worker on a host its own --metrics-port, or 0 for a free one)"
            ) from exc
        listeners.append(listener)
        sampler.start()
        self.stdout.write(f"metrics on http://{options['metrics_addr']}:{port}/metrics")
        sys.stdout.flush()
        return sampler

    # --- output -----------------------------------------------------------------------------
    def _on_event(self, event: WorkerEvent) -> None:
        if event.name in FINAL_EVENTS and self._verbosity >= 2 and event.message is not None:
            m = event.message
            took = f" {event.duration * 1000:.1f} ms" if event.duration is not None else ""
            error = f" {type(event.error).__name__}: {event.error}" if event.error else ""
            self.stdout.write(f"{event.name:<13} {m} attempt={m.attempt}{took}{error}")
        elif event.name == "summary" and self._verbosity >= 1 and event.stats is not None:
            self.stdout.write(self._summary(event.stats))
        elif event.name == "stopping" and self._verbosity >= 1:
            self.stdout.write("stopping: finishing in-flight messages")
        else:
            return
        sys.stdout.flush()

    def _depth_max_age(self) -> float:
        return max(self._worker.summary_interval or 0.0, STATS_MAX_AGE_SECONDS)

    def _summary(self, stats: WorkerStats) -> str:
        """The summary line. Queue depths come from the process's stats cache
        (``engines.stats.stats_cache.peek``): never read on this (the intake) thread, at most
        once per queue every ``max(--summary-interval, STATS_MAX_AGE_SECONDS)`` seconds, and
        once more when the worker has stopped (the line printed at stop, a burst's only one,
        waits up to ``FINAL_DEPTH_WAIT_SECONDS`` in all for these reads). A depth read longer
        ago than ``--summary-interval`` says when it was read."""

        now = time.monotonic()
        since, before = self._last
        self._last = (now, stats.processed)
        rate = (stats.processed - before) / max(now - since, 1e-9)
        interval = self._worker.summary_interval or 0.0
        final = self._worker.stopping
        if final:  # one read per queue after the work, side by side, waited for (bounded)
            try:
                models = [plan.model for plan in self._worker.plans]
                stats_cache.refresh(models, wait=FINAL_DEPTH_WAIT_SECONDS)
            except Exception:  # the summary must never stop the worker
                logger.debug("reading the depths at stop failed", exc_info=True)
        depth = []
        for plan in self._worker.plans:
            error: BaseException | None
            try:
                reading = (
                    stats_cache.latest(plan.model)
                    if final
                    else stats_cache.peek(plan.model, max_age=self._depth_max_age())
                )
            except Exception as exc:  # the summary must never stop the worker
                reading, error = None, exc
            else:
                error = reading.error if reading is not None else None
            if reading is not None and reading.stats is not None:
                s = reading.stats
                age = time.monotonic() - reading.at
                when = f"; read {age:.0f} s ago" if age > max(interval, 1.0) else ""
                depth.append(f"{plan.label}={s.total} (ready {s.ready}, leased {s.leased}{when})")
            elif error is not None:
                depth.append(f"{plan.label}=? ({type(error).__name__})")
            else:
                depth.append(f"{plan.label}=?")
        line = (
            f"processed={stats.processed} failed={stats.failed} timed_out={stats.timed_out} "
            f"retried={stats.retried} "
            f"dead_lettered={stats.dead_lettered} rate={rate:.1f}/s "
            f"{_commits(stats)}"
            f"depth: {'; '.join(depth)}"
        )
        failing = [h for h in self._worker.queue_health().values() if h.failing]
        if failing:
            line += " failing: " + "; ".join(h.describe(now) for h in failing)
        return line
