"""The fault drill: send a batch to the drill queue, run ``runqueueworker`` child processes,
SIGKILL them at random points of the drain, optionally make the database abort transactions,
wait for the queue to drain, then count the effects.

Guarantees of the measurement:

- *handled*: messages of this run with at least one committed ``DrillEffect`` row;
- *lost*: messages sent (committed) by this run with no effect row once the queue is empty (or
  once the drill gave up waiting: then ``drained`` is false and the drill fails);
- *handled twice*: messages with more than one effect row. The row is written in the receiver's
  transaction, which also acks the message, so a second row means the work committed twice.

The drill touches only its own queue and table: its workers are started with the drill queue as
their only queue, and the abort injectors reach only the drill's worker sessions (``pg-terminate``
selects them by ``application_name``) or run the command the user gave, ended when the drill's
``timeout`` is up. It still loads the database (on SQLite it holds the only write lock while
its receivers run): a database holding other apps' rows is refused unless
``allow_shared_database``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import django
from django.apps import apps
from django.db import DatabaseError, connections, router
from django.db.models import Count, Max

import spanner_queues
from spanner_queues import clock
from spanner_queues.contrib.drill.models import DrillEffect, DrillMessage, DrillOrdered
from spanner_queues.drivers import driver_for
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import QueueError
from spanner_queues.monitoring import QueueDepthSample
from spanner_queues.queues import queue_models
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from spanner_queues.engines.base import QueueStats
    from spanner_queues.models import Queue

ABORT_METHODS = ("none", "pg-terminate", "command")
#: seconds between the drill's workers' summary lines (``--summary-interval``)
WORKER_SUMMARY_INTERVAL = 1.0

#: how a worker is stopped at a kill point: SIGKILL, SIGTERM (it drains first), either at random
SIGNALS = ("kill", "term", "mixed")
#: messages per send transaction (far below Spanner's mutations-per-commit limit)
SEND_BATCH = 200
#: seconds after its start from which a worker is preferred as a kill's victim
SETTLED_SECONDS = 2.0
#: apps whose rows do not make a database someone else's (Django's own, this package's)
OWN_APPS = ("django.contrib.", "spanner_queues")
#: models with rows named in a refusal, at most (the search stops there)
OTHER_DATA_SHOWN = 5


class DrillError(QueueError):
    """The drill could not run as asked (bad options, no workers could start)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrillOptions:
    messages: int = 1000
    workers: int = 3
    concurrency: int = 2
    kills: int = 5
    lease: float | None = 5.0
    work_ms: float = 10.0
    abort_every: float = 0.0
    abort_method: str = "none"
    abort_command: str = ""
    timeout: float = 600.0
    sample_interval: float = 0.5
    keep_effects: bool = False
    seed: int | None = None
    worker_args: tuple[str, ...] = ()
    allow_shared_database: bool = False
    #: the Pub/Sub mode (``contrib/drill/pubsub``): relay and inbox workers, two services
    pubsub: bool = False
    signal: str = "kill"
    #: the ordered mode (``--ordered``): ``streams`` ordering keys of numbered messages,
    #: each key's order checked as the receivers saw it
    ordered: bool = False
    streams: int = 10


@dataclass(frozen=True, slots=True)
class DrillEvent:
    at: datetime
    elapsed: float
    kind: str  # "kill", "term", "abort", "exit", "start", "drained", "settled", "timeout"
    detail: str


@dataclass(slots=True, kw_only=True)
class DrillResult:
    run: str
    options: DrillOptions
    started_at: datetime
    queue: str
    engine: str
    database: str
    database_engine: str
    #: versions and host: ``spanner_queues``, ``django``, ``driver``, ``database_server``,
    #: ``python``, ``host``, ``platform``
    environment: dict[str, str] = field(default_factory=dict)
    #: "queue" (one queue, its workers), "ordered" (an ordered queue, its workers) or "pubsub"
    #: (relay, Pub/Sub, inbox; ordered too when ``options.ordered``)
    mode: str = "queue"
    sent: int = 0
    send_seconds: float = 0.0
    kills: int = 0
    #: workers sent SIGTERM at a kill point (``--signal term`` or ``mixed``)
    terms: int = 0
    aborts: int = 0
    retries_seen: int = 0
    unexpected_exits: int = 0
    handled: int = 0
    effects: int = 0
    redelivered: int | None = None
    lost_keys: list[str] = field(default_factory=list)
    twice_keys: list[str] = field(default_factory=list)
    drained: bool = False
    drain_seconds: float = 0.0
    left_in_queue: int = 0
    #: from the workers' last summary lines (``processed=``, ``commits/msg=``, ``group=``):
    #: run commits per message and messages per group (group commit); None: no line said
    commits_per_message: float | None = None
    group_size: float | None = None
    leftovers_at_start: int = 0
    samples: list[QueueDepthSample] = field(default_factory=list)
    events: list[DrillEvent] = field(default_factory=list)
    worker_logs: list[Path] = field(default_factory=list)
    #: the Pub/Sub mode's figures (None in the queue mode): topic and subscription paths and
    #: where Pub/Sub is; publishes the relay confirmed (more than ``sent``: published again);
    #: copies the inbox dropped as already taken in; events taken in only by the drill's
    #: closing pull (left on the subscription); events moved to the dead-letter queue (and
    #: ``publish_failures``, ``pull_failures`` below)
    pubsub: dict[str, str] = field(default_factory=dict)
    published: int | None = None
    duplicates_dropped: int | None = None
    left_on_subscription: int | None = None
    dead_lettered: int | None = None
    #: the faults the Pub/Sub workers felt (as counted in their logs, lower bounds): messages
    #: of relay runs Pub/Sub did not confirm (given back), and inbox pulls that failed
    publish_failures: int | None = None
    pull_failures: int | None = None
    #: the ordered mode's findings (``options.ordered``), one line each: a message that ran
    #: before the one before it had committed, or after a later one (an inversion, a gap or a
    #: second run of a stream)
    order_violations: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return len(self.lost_keys)

    @property
    def twice(self) -> int:
        return len(self.twice_keys)

    @property
    def passed(self) -> bool:
        ok = self.drained and self.lost == 0 and self.twice == 0 and not self.order_violations
        if self.mode == "pubsub":  # nothing left anywhere: both queues, Pub/Sub, dead letters
            ok = ok and self.left_in_queue == 0
            ok = ok and not self.left_on_subscription and not self.dead_lettered
        return ok


class _Worker:
    """One ``runqueueworker`` child on the drill queue, its output in a log file; ``role``
    names what it runs ("worker"; "relay" or "inbox" in the Pub/Sub mode)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, role: str) -> None:
        self.log = log
        self.role = role
        self.started = time.monotonic()
        #: SIGTERM sent: a second one would make it exit at once, unacked and with no summary
        self.terminated = False
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the drill, which stops them
                preexec_fn=_end_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self) -> None:
        """SIGTERM once: the worker finishes its in-flight messages and exits."""
        if self.alive() and not self.terminated:
            self.terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, grace: float) -> int | None:
        """SIGTERM (unless sent already), then SIGKILL after ``grace`` seconds; the exit
        status."""
        if self.alive():
            self.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def _end_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: SIGTERM this worker when the drill dies (SIGKILLed itself); elsewhere nothing."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_bounded(command: str, timeout: float) -> int | None:
    """Run the shell ``command`` in a session of its own; its exit status, or None when it ran
    past ``timeout`` seconds (then its whole process group is killed)."""
    proc = subprocess.Popen(
        command,
        shell=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def other_data(alias: str) -> list[str]:
    """Labels of models on database ``alias``, outside Django's own apps and this package's,
    that hold a row (at most ``OTHER_DATA_SHOWN``; one ``exists`` read or queue ``stats`` per
    model until then). A table that cannot be read (not migrated) counts as empty."""
    queues = {model._meta.label: model for model in queue_models()}
    found: list[str] = []
    for model in apps.get_models():
        meta = model._meta
        if meta.app_config is None or meta.app_config.name.startswith(OWN_APPS):
            continue
        if not meta.managed or meta.proxy or not router.allow_migrate_model(alias, model):
            continue
        try:
            queue = queues.get(meta.label)
            if queue is not None:
                engine = engine_for(queue)
                held = engine.database == alias and engine.stats(queue).total > 0
            else:
                held = model._default_manager.using(alias).exists()
        except (DatabaseError, QueueError):
            held = False
        if held:
            found.append(meta.label)
            if len(found) >= OTHER_DATA_SHOWN:
                break
    return found


def environment(alias: str) -> dict[str, str]:
    """What a report must name to be compared with another: the versions of this package,
    Django, the database driver and server, Python, and the host."""
    driver, server = driver_for(alias).versions()
    return {
        "spanner_queues": spanner_queues.__version__,
        "django": django.get_version(),
        "driver": driver,
        "database_server": server,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
    }


def worker_command() -> list[str]:
    """How to start ``manage.py`` again: this ``manage.py`` when run through one, else
    ``python -m django`` (with this process's settings module and import path)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == "manage.py" and script.is_file():
        return [sys.executable, str(script.resolve())]
    return [sys.executable, "-m", "django"]


class Drill:
    """One run of the drill (``run()`` once)."""

    #: the queue the drill sends to
    queue: ClassVar[type[Queue]] = DrillMessage
    #: the result's mode: "queue", "ordered" (``OrderedDrill``) or "pubsub" (``PubSubDrill``)
    mode: ClassVar[str] = "queue"

    def __init__(
        self,
        options: DrillOptions,
        report_dir: Path,
        *,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        if options.abort_method not in ABORT_METHODS:
            raise DrillError(f"abort method must be one of {', '.join(ABORT_METHODS)}")
        if options.abort_method == "command" and not options.abort_command:
            raise DrillError("--abort-method command needs --abort-command")
        if options.abort_every > 0 and options.abort_method == "none":
            raise DrillError("--abort-every needs --abort-method pg-terminate or command")
        if options.signal not in SIGNALS:
            raise DrillError(f"signal must be one of {', '.join(SIGNALS)}")
        if options.messages < 1 or options.workers < 1:
            raise DrillError("the drill needs at least one message and one worker")
        if options.seed is None:  # drawn here, so that the report can say it
            options = dataclasses.replace(options, seed=random.SystemRandom().randrange(2**32))
        self.options = options
        self.report_dir = report_dir
        self.log = log
        self.random = random.Random(options.seed)
        self.run_id = uuid.uuid4().hex[:12]
        self.engine = engine_for(self.queue)
        self.alias = self.engine.database
        self.workers: list[_Worker] = []
        #: workers sent SIGTERM at a kill point, still draining (waited for at the end)
        self.stopping: list[_Worker] = []
        #: role -> when a worker of it was last killed, stopped or found exited (monotonic)
        self.disrupted: dict[str, float] = {}
        self._started = 0.0
        self._spawned = 0
        self._handled_before = 0
        self._exits_without_progress = 0
        settings = connections[self.alias].settings_dict
        self.result = DrillResult(
            run=self.run_id,
            options=options,
            started_at=clock.now(),
            queue=self.queue._meta.label,
            engine=f"{type(self.engine).__module__}.{type(self.engine).__name__}",
            database=self.alias,
            database_engine=str(settings.get("ENGINE", "")),
            mode=self.mode,
        )

    # --- the run ------------------------------------------------------------------------------
    def run(self) -> DrillResult:
        result = self.result
        try:
            result.leftovers_at_start = self._depth_now()
        except Exception as exc:
            raise DrillError(
                f"cannot read the drill queue ({type(exc).__name__}: {exc}); is it migrated? "
                f"python manage.py migrate {self.queue._meta.app_label}"
            ) from exc
        if not self.options.allow_shared_database:
            self._refuse_other_data()
        result.environment = environment(self.alias)
        self.report_dir.mkdir(parents=True, exist_ok=True)
        (self.report_dir / "workers").mkdir(exist_ok=True)
        self._started = time.monotonic()
        result.started_at = clock.now()
        self._prepare()
        try:
            self._send()
            for role in self._roles():
                for _ in range(self.options.workers):
                    self._spawn(role)
            self._drive()
            if result.drained:
                self._settle()
        finally:
            self._stop_workers()
        self._sample()
        self._after_workers()
        self._count()
        if not self.options.keep_effects:
            self._delete_effects()
        return result

    # --- the hooks of a mode (the Pub/Sub mode overrides them) ---------------------------------
    def _depth_now(self) -> int:
        """Messages in the drill's queues now."""
        return self.engine.stats(self.queue).total

    def _prepare(self) -> None:
        """Make ready what the workers need beside the database (nothing here)."""

    def _roles(self) -> tuple[str, ...]:
        """The kinds of worker started, ``options.workers`` of each."""
        return ("worker",)

    def _queue_args(self, role: str) -> list[str]:
        """The queue names a worker of ``role`` serves."""
        return [self.queue._meta.label]

    def _drained(self, stats: QueueStats | None) -> bool:
        """Whether the drill's work is done (the queue is empty)."""
        return stats is not None and stats.total == 0

    def _settle(self) -> None:
        """After the drain, before the workers stop (nothing here)."""

    def _after_workers(self) -> None:
        """After the workers stopped, before the count (nothing here)."""

    def _refuse_other_data(self) -> None:
        found = other_data(self.alias)
        if found:
            more = "" if len(found) < OTHER_DATA_SHOWN else " and maybe more"
            raise DrillError(
                f"database {self.alias!r} does not look like a drill's database: "
                f"{', '.join(found)}{more} hold rows. The drill sends a burst and runs "
                "workers that SIGKILL and restart; on SQLite its receivers hold the only write "
                "lock (an ordinary send beside it waited seconds, or failed with 'database is "
                "locked'). Run it on a database of its own, or pass --allow-shared-database "
                "(PostgreSQL, Spanner: its rows are its own, the load is not)."
            )

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _event(self, kind: str, detail: str) -> None:
        event = DrillEvent(clock.now(), self._elapsed(), kind, detail)
        self.result.events.append(event)
        self.log(f"{event.elapsed:7.2f}s  {kind:<8} {detail}")

    def _send(self) -> None:
        payload = {"run": self.run_id, "work_ms": self.options.work_ms}
        began = time.monotonic()
        for first in range(0, self.options.messages, SEND_BATCH):
            keys = [
                f"{self.run_id}-{n:07d}"
                for n in range(first, min(first + SEND_BATCH, self.options.messages))
            ]
            batch = [{"id": key, "payload": {**payload, "key": key}} for key in keys]
            run_in_transaction(
                partial(self.queue.send_many, batch, using=self.alias), using=self.alias
            )
            self.result.sent += len(batch)
        self.result.send_seconds = time.monotonic() - began
        self._event("sent", f"{self.result.sent} messages in {self.result.send_seconds:.2f} s")

    def _worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PGAPPNAME"] = self._app_name()  # libpq: the sessions pg-terminate may end
        env["SQ_DRILL_WORKER"] = self.run_id  # counting.install(): count DB-API replays
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])
        return env

    def _app_name(self) -> str:
        return f"queuedrill-{self.run_id}"

    def _spawn(self, role: str) -> None:
        self._spawned += 1
        argv = [
            *worker_command(),
            "runqueueworker",
            *self._queue_args(role),
            "--concurrency",
            str(self.options.concurrency),
            "--worker-id",
            f"drill-{self.run_id}-{self._spawned}",
            "-v1",
            # a summary line each second: a worker SIGKILLed early still leaves its commit
            # figures (the default 10 s left none when every survivor started after the drain)
            "--summary-interval",
            str(WORKER_SUMMARY_INTERVAL),
        ]
        if self.options.lease and self.engine.features.supports_custom_lease:
            argv += ["--lease", str(self.options.lease)]
        argv += list(self.options.worker_args)
        log = self.report_dir / "workers" / f"{role}-{self._spawned}.log"
        worker = _Worker(argv, self._worker_env(), log, role)
        self.workers.append(worker)
        self.result.worker_logs.append(log)
        self._event("start", f"{role} {self._spawned} (pid {worker.pid})")

    def _drive(self) -> None:
        """Sample, kill, abort and restart until the queue is empty or the time is up."""
        options, result = self.options, self.result
        # kill points: random fractions of the batch handled, one in each of ``kills`` equal
        # slices of 10-80 %, so that every kill falls in the drain however fast the database is
        share = 0.7 / max(options.kills, 1)
        points = [
            options.messages * self.random.uniform(0.1 + i * share, 0.1 + (i + 1) * share)
            for i in range(options.kills)
        ]
        next_abort = self._next_abort()
        # the first abort also has a point in the batch (10-50 % handled): a drain quicker than
        # --abort-every still has one outage in it, not a report of outages it never had
        abort_point = (
            options.messages * self.random.uniform(0.1, 0.5) if next_abort is not None else None
        )
        while True:
            stats = self._sample()
            handled = self._handled_rows()
            if not self._reap(handled):
                result.drain_seconds = self._elapsed()
                return
            self._kill_at(points, handled)
            first_due = abort_point is not None and handled >= abort_point
            if next_abort is not None and (first_due or time.monotonic() >= next_abort):
                self._abort()
                abort_point = None
                next_abort = self._next_abort()
            if self._drained(stats):
                if points:  # a batch taken in at once since ``handled`` was read passed them
                    handled = self._handled_rows()
                    self._kill_at(points, handled)
                result.drained = True
                result.drain_seconds = self._elapsed()
                self._event("drained", f"queue empty; {handled} effect rows")
                return
            if self._elapsed() > options.timeout:
                result.drain_seconds = self._elapsed()
                self._event("timeout", f"gave up after {options.timeout:.0f} s")
                return
            time.sleep(options.sample_interval)

    def _kill_at(self, points: list[float], handled: int) -> None:
        """A kill for every point ``handled`` has passed since the last look."""
        while points and handled >= points[0]:
            points.pop(0)
            self._kill()

    def _next_abort(self) -> float | None:
        if self.options.abort_every <= 0:
            return None
        return time.monotonic() + self.options.abort_every * self.random.uniform(0.5, 1.5)

    def _sample(self) -> QueueStats | None:
        with self._db():
            stats = self.engine.stats(self.queue)
            self.result.samples.append(QueueDepthSample.from_stats(stats))
            return stats
        return None

    def _handled_rows(self) -> int:
        with self._db():
            return DrillEffect.objects.using(self.alias).filter(run=self.run_id).count()
        return 0

    @contextlib.contextmanager
    def _db(self) -> Iterator[None]:
        """A read of the drill's own bookkeeping; a failure (the server restarting under
        ``--abort-command``) drops the connection and skips this round."""
        try:
            yield
        except Exception as exc:
            self._event("db-error", f"{type(exc).__name__}: {str(exc)[:120]}")
            connections[self.alias].close()

    def _reap(self, handled: int) -> bool:
        """Replace workers that ended without being killed by the drill; False when so many
        did with no progress meanwhile that the drill gives up (workers that cannot start)."""
        if handled > self._handled_before:
            self._handled_before, self._exits_without_progress = handled, 0
        for worker in list(self.workers):
            if not worker.alive():
                self._exits_without_progress += 1
                if self._exits_without_progress > max(3, 2 * self.options.workers):
                    self._event("gave-up", f"workers keep exiting: see {worker.log.name}")
                    return False
                self.workers.remove(worker)
                self.disrupted[worker.role] = time.monotonic()
                self.result.unexpected_exits += 1
                self._event("exit", f"pid {worker.pid} exited with {worker.proc.returncode}")
                self._spawn(worker.role)
        return True

    def _kill(self) -> None:
        alive = [w for w in self.workers if w.alive()]
        if not alive:
            return
        # rather a worker that has had time to start receiving than one still starting
        settled = [w for w in alive if time.monotonic() - w.started > SETTLED_SECONDS]
        victim = self.random.choice(settled or alive)
        how = self.options.signal
        if how == "mixed":
            how = self.random.choice(("kill", "term"))
        self.workers.remove(victim)
        self.disrupted[victim.role] = time.monotonic()
        if how == "kill":
            victim.kill()
            self.result.kills += 1
            self._event("kill", f"SIGKILL {victim.role} pid {victim.pid}")
        else:  # it drains its in-flight messages and exits; its successor starts meanwhile
            victim.terminate()
            self.stopping.append(victim)
            self.result.terms += 1
            self._event("term", f"SIGTERM {victim.role} pid {victim.pid}")
        self._spawn(victim.role)

    def _abort(self) -> None:
        method = self.options.abort_method
        if method == "pg-terminate":
            with self._db():
                with connections[self.alias].cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = %s AND pid <> pg_backend_pid()",
                        [self._app_name()],
                    )
                    ended = sum(1 for (ok,) in cursor.fetchall() if ok)
                if ended:  # none when no worker had a session open at that moment
                    self.result.aborts += ended
                    self._event("abort", f"terminated {ended} worker session(s)")
        elif method == "command":
            left = self.options.timeout - self._elapsed()
            if left <= 0:
                return
            status = run_bounded(self.options.abort_command, left)
            connections[self.alias].close()  # a restarted server dropped our session too
            self.result.aborts += 1
            if status is None:
                self._event("abort", f"--abort-command timed out after {left:.1f} s; ended")
            else:
                self._event("abort", f"--abort-command exited with {status}")

    def _stop_workers(self) -> None:
        for worker in self.workers:
            worker.terminate()
        for worker in [*self.workers, *self.stopping]:
            worker.stop(grace=30.0)
        self.workers.clear()
        self.stopping.clear()

    # --- counting -----------------------------------------------------------------------------
    def _count(self) -> None:
        result = self.result
        rows = DrillEffect.objects.using(self.alias).filter(run=self.run_id)
        per_key = {row["key"]: row["n"] for row in rows.values("key").annotate(n=Count("id"))}
        sent = self._sent_keys()
        result.handled = sum(1 for key in sent if per_key.get(key, 0) >= 1)
        result.effects = sum(per_key.values())
        result.lost_keys = [key for key in sent if key not in per_key]
        result.twice_keys = sorted(key for key, n in per_key.items() if n > 1)
        result.retries_seen = sum(
            row["m"] or 0 for row in rows.values("worker").annotate(m=Max("retries"))
        )
        if self.engine.features.supports_attempt_count:
            result.redelivered = rows.filter(attempt__gt=1).count()
        result.left_in_queue = self._depth_now()
        result.commits_per_message, result.group_size = commit_figures(result.worker_logs)

    def _sent_keys(self) -> list[str]:
        """The effect keys of the messages this run sent."""
        return [f"{self.run_id}-{n:07d}" for n in range(self.result.sent)]

    def _delete_effects(self) -> None:
        rows = DrillEffect.objects.using(self.alias).filter(run=self.run_id)
        ids = list(rows.values_list("id", flat=True))
        for first in range(0, len(ids), 500):
            DrillEffect.objects.using(self.alias).filter(id__in=ids[first : first + 500]).delete()


class OrderedDrill(Drill):
    """``queuedrill --ordered``: ``streams`` ordering keys of an ordered queue
    (``QueueMeta.ordered_by``), ``messages`` numbered messages spread over them in send order,
    under the same kills and aborts. Each effect records the highest number of its stream that
    had committed when its transaction read it (``DrillEffect.after``); a stream ran in order,
    one at a time, each message once, when every effect's ``after`` is its ``seq - 1``: no gap,
    no inversion, no double. ``OrderedPubSubDrill`` (``--pubsub --ordered``) sends the same
    streams through the relay, Pub/Sub and an ordered inbox."""

    queue: ClassVar[type[Queue]] = DrillOrdered
    mode: ClassVar[str] = "ordered"

    def __init__(
        self,
        options: DrillOptions,
        report_dir: Path,
        *,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        if options.streams < 1:
            raise DrillError("--ordered needs at least one stream")
        super().__init__(options, report_dir, log=log)

    def _stream(self, n: int) -> tuple[str, int]:
        """Message ``n`` of the run (from 0): its stream and its number there (from 1)."""
        streams = min(self.options.streams, self.options.messages)
        return f"s{n % streams:03d}", n // streams + 1

    def _send(self) -> None:
        payload = {"run": self.run_id, "work_ms": self.options.work_ms}
        began = time.monotonic()
        for first in range(0, self.options.messages, SEND_BATCH):
            batch = []
            for n in range(first, min(first + SEND_BATCH, self.options.messages)):
                stream, seq = self._stream(n)
                batch.append(
                    {
                        "stream": stream,
                        "message_id": uuid.uuid4().hex[:16],  # not the send order
                        "payload": {**payload, "seq": seq},
                    }
                )
            run_in_transaction(
                partial(self.queue.send_many, batch, using=self.alias), using=self.alias
            )
            self.result.sent += len(batch)
        self.result.send_seconds = time.monotonic() - began
        streams = min(self.options.streams, self.options.messages)
        self._event(
            "sent",
            f"{self.result.sent} messages in {streams} streams in {self.result.send_seconds:.2f} s",
        )

    def _sent_keys(self) -> list[str]:
        keys = []
        for n in range(self.result.sent):
            stream, seq = self._stream(n)
            keys.append(f"{self.run_id}-{stream}-{seq:07d}")
        return keys

    def _count(self) -> None:
        super()._count()
        rows = DrillEffect.objects.using(self.alias).filter(run=self.run_id)
        found = sorted(
            (key.rsplit("-", 2)[1], seq or 0, after or 0)
            for key, seq, after in rows.values_list("key", "seq", "after")
        )
        violations = self.result.order_violations
        for stream, seq, after in found:
            if after != seq - 1:
                what = "after a later one" if after >= seq else "before the one before it"
                violations.append(
                    f"{stream}: message {seq} ran {what} (its stream had reached {after})"
                )


_SUMMARY = re.compile(r"processed=(\d+) .*?commits/msg=([\d.]+)(?: group=([\d.]+))?")


def commit_figures(logs: list[Path]) -> tuple[float | None, float | None]:
    """Run commits per message and messages per group over the workers, from the last summary
    line of each log (a killed worker's last periodic one): (None, None) when none says."""
    messages = commits = grouped = groups = 0.0
    for log in logs:
        try:
            found = _SUMMARY.findall(log.read_text(errors="replace"))
        except OSError:
            continue
        if not found:
            continue
        processed, per_message, size = found[-1]
        n = int(processed)
        messages += n
        commits += n * float(per_message)
        if size:
            grouped += n
            groups += n / float(size)
    if not messages:
        return None, None
    return commits / messages, (grouped / groups if groups else None)
