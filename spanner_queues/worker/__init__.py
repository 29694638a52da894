"""The worker: receive messages, run receivers, ack, retry, renew leases, stop gracefully.

``Worker`` is a plain class; ``manage.py runqueueworker`` is a thin adapter over it. This module
is the worker's lifecycle, top to bottom: its parts, start and stop, the executor threads (run
receivers, ack in their transaction) and its signal handling. Beside it: ``intake`` (receive
into slots, prefetch, a failing queue's back-off, pauses, re-seeds, when a burst ends),
``run`` and ``group`` (the *run* station), ``outcomes``, ``decide`` and ``apply`` (the delivery
pipeline's value and its *decide* and *apply* stations: retry, failure, dead letter, discard,
give-back), ``leases`` (the renewer thread), ``limits`` (time limits, per-queue concurrency and
rate), ``events`` (events, counters, listeners) and ``health`` (``/livez``, ``/readyz``).
Guarantees:

- It never holds more messages than it has free slots: ``concurrency`` threads, each holding
  up to ``prefetch`` units (a batch queue fills one slot with up to ``batch_size`` messages).
  One receive claims up to ``concurrency * prefetch`` minus those held, and, past one unit per
  thread, claims again only when fewer than ``concurrency`` are left waiting (serving batch
  receivers, ``BATCH_UNITS_AHEAD`` a thread: a batch's claim may take as long as its run). By
  default (``prefetch=None``) the prefetch adapts: one unit per free thread (serving batch
  receivers, two: one claimed ahead) until a unit was timed,
  then, while receives come back full, doubling up to what a thread can start within
  ``min(AHEAD_SECONDS, lease / 2)`` at the measured average run time (at most
  ``Intake.most_ahead()``: ``AUTO_PREFETCH_MAX``, or two of the thread's largest groups); it
  drops at once when receivers slow down, and slow receivers take one. ``prefetch=N`` fixes
  it (1: claim only for free threads). Each message is still processed on its own, in its own
  transaction with its ack; waiting messages' leases are renewed like running ones; a waiting
  message whose lease was lost or has expired is not run.
  On ``stop()`` messages that were prefetched but not started are given back due now without
  spending an attempt (first delivery: ack and re-send in one transaction) or, if they had
  failed before, run first.
- An ``atomic`` receiver's writes and the ack of its message commit in one transaction; a
  non-atomic receiver runs outside any transaction, then its messages are acked. The ack holds
  the lease held now (renewals rotate it) and refuses a message whose lease was lost while the
  receiver ran (``LeaseLost``: nothing acked, the writes roll back).
- ``raise Retry(after=...)``: the receiver's writes roll back; the message is acked and sent
  again under the same key, due ``after`` later, in one transaction.
- Any other exception: the transaction rolls back, the error is logged with queue, key and
  attempt, and the message is released due after the engine's back-off (or, if the engine
  cannot release, left to its lease expiry). Past ``QueueMeta.max_attempts`` the message moves to
  the queue's dead-letter queue, or is dropped (logged) with ``discard_after_max_attempts``.
- A non-atomic receiver that acked some of its messages itself (``api.ack``, ``requeue``,
  ``dead_letter``) and then raised: those acks stand and count as processed; the outcome of
  the error is the other messages' (the Pub/Sub relay's partial publish failures); when it
  acked them all, the error is logged (ERROR, ``action: error``) and nothing fails.
  ``AckedFailure`` keeps its meaning: acked by the receiver, reported failed (the Tasks runner).
- Leases are renewed in the background halfway through each lease. If a renewal loses a lease,
  the worker no longer treats the message as its own: it does not ack, retry or release it.
- A queue whose receive raises (dropped, a missing grant, unreachable) fails alone: it backs
  off (doubling, at most ``QUEUE_BACKOFF_MAX`` seconds) while the other queues go on, shows in
  ``queue_health()``, the summary line and the ``receive_failed`` / ``queue_recovered`` events,
  and is logged once per failure episode.
- ``stop()`` (first SIGTERM/SIGINT): receive nothing more, finish and ack in-flight messages,
  return. A second signal ends the process at once with exit status 1.
- Time limits (``timeout``, or ``@receiver(timeout=...)``): a receiver past its limit is
  interrupted where Python allows, its delivery counts as a failed attempt and its message goes
  back to the queue; one that cannot be interrupted within ``STUCK_GRACE_SECONDS`` stops the
  worker: ``run()`` raises ``WorkerStuck`` (``limits``). A stop therefore ends within the longest
  time limit plus that grace.
- A receiver that raises a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
  ``KeyboardInterrupt``...): its transaction rolls back, the error is logged (``critical``), the
  worker stops as on ``stop()`` and ``run()`` raises ``WorkerCrashed`` from it; the message is
  left leased (not released, not acked) and is delivered again after its lease.

How one message goes: the intake (``intake.Intake.fill``) receives it into a slot
(``slots.Slots.hold``) as a ``Delivery`` of its queue's ``Plan`` (database, engine, options,
delivery policy); an executor takes it (``Slots.take``), its ``run.Runner`` runs its receiver
(``_run``: in the receiver's transaction with its ack when ``atomic``), which returns one
``outcomes.Outcome`` per message (acked, retry, failed, timed out, lease lost, already acked;
before a run: unmatched, exhausted, lease lost); one function, ``Outcomes.settle``, applies the
delivery policy to them; the slot is freed (``Slots.done``). A single message whose receiver
may be grouped runs with more of its queue's messages waiting, in one transaction and one
commit (``group.Groups``). The parts beside the worker hold narrow handles, never the
``Worker``: a ``Reporter`` (events, counters, log fields), the ``Slots``, the ``Leases``, the
plans.

Locking: ``Slots.cond`` (and ``renew_cond``, on the same lock) guard the slot accounting, which
changes in ``Slots``'s own methods only (see ``slots``). ``Leases.lock`` is held by a renewal,
and by whoever reads a delivery's lease token to ack, retry, release or dead-letter it
(``Leases.freeze``), so the token acked with is the row's until the ack commits.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from functools import partial
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

from django.db import connections

from spanner_queues import api
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import (
    BurstFailed,
    InvalidArgument,
    QueueConfigurationError,
    WorkerCrashed,
    WorkerStuck,
)
from spanner_queues.options import queue_options
from spanner_queues.queues import get_queue
from spanner_queues.receivers import (
    ReceiverRegistry,
    receivers,
)
from spanner_queues.signals import worker_stopped
from spanner_queues.transactions import (
    recycle_connections,
)
from spanner_queues.worker.apply import DeliveryPolicy, Outcomes
from spanner_queues.worker.decide import PARKED_UNTIL
from spanner_queues.worker.events import (
    FINAL_EVENTS,
    Reporter,
    WorkerEvent,
    WorkerEvents,
    WorkerStats,
)
from spanner_queues.worker.group import Groups
from spanner_queues.worker.intake import Intake, QueueHealth
from spanner_queues.worker.leases import Leases, Renewer
from spanner_queues.worker.limits import (
    STUCK_GRACE_SECONDS,
    QueueLimits,
    TimeLimits,
)
from spanner_queues.worker.run import Runner
from spanner_queues.worker.slots import Plan, Slots, Unit

if TYPE_CHECKING:
    from spanner_queues.models import Queue

logger = logging.getLogger("spanner_queues.worker")

__all__ = [
    "FINAL_EVENTS",
    "MAX_CONCURRENCY",
    "MAX_PREFETCH",
    "PARKED_UNTIL",
    "STUCK_GRACE_SECONDS",
    "QueueHealth",
    "Worker",
    "WorkerEvent",
    "WorkerEvents",
    "WorkerStats",
    "on_stop",
    "recycle_connections",
]

#: most receiver threads one worker process runs (each is a thread and a database connection)
MAX_CONCURRENCY = 1024
#: most units each thread may hold (prefetch)
MAX_PREFETCH = 1000


def abort_process() -> None:
    """End the process now, exit status 1 (unacked messages come back after their lease)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


class Worker:
    """Runs the receivers of ``queues`` (default: every queue that has receivers).

    Configuration errors (unknown queue, receiver for an undeclared queue, no receivers) raise
    ``QueueConfigurationError`` from the constructor, before any message is received.
    """

    #: the receiving side (``intake``), built last: the parts before it call it back
    intake: Intake

    def __init__(
        self,
        queues: Sequence[str | type[Queue]] | None = None,
        *,
        concurrency: int = 1,
        prefetch: int | None = None,
        batch_size: int = 10,
        burst: bool = False,
        max_messages: int | None = None,
        lease: timedelta | None = None,
        poll_interval: float = 0.05,
        worker_id: str | None = None,
        registry: ReceiverRegistry | None = None,
        listeners: Sequence[Callable[[WorkerEvent], None]] = (),
        install_signal_handlers: bool = True,
        summary_interval: float | None = None,
        reseed_interval: float | None = 60.0,
        timeout: float | None = None,
        stuck_grace: float = STUCK_GRACE_SECONDS,
        abort: Callable[[], None] = abort_process,
        group_size: int | None = None,
        group_ms: float | None = None,
    ) -> None:
        _check_arguments(
            concurrency=concurrency,
            prefetch=prefetch,
            batch_size=batch_size,
            max_messages=max_messages,
            lease=lease,
            poll_interval=poll_interval,
            reseed_interval=reseed_interval,
            timeout=timeout,
            stuck_grace=stuck_grace,
        )
        self.concurrency = concurrency
        #: units each thread may hold (None: adaptive)
        self.prefetch = prefetch
        self.batch_size = batch_size
        self.burst = burst
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.registry = registry if registry is not None else receivers
        self.install_signal_handlers = install_signal_handlers
        self.summary_interval = summary_interval
        #: time limit in seconds of receivers that set none (None: no limit)
        self.timeout = timeout
        self.plans: list[Plan] = plan_queues(queues, self.registry, batch_size, timeout)
        self._init_parts(listeners, stuck_grace)
        #: group commit (``group``): messages per commit and receiver time per group of
        #: queues that set none (None: ``DEFAULT_GROUP_SIZE``, ``DEFAULT_GROUP_MS``)
        self.groups = Groups(self.runner, size=group_size, ms=group_ms)
        #: the receiving side, on the thread that calls ``run`` (``intake``)
        self.intake = Intake(
            self.plans,
            slots=self.slots,
            units=self.units,
            reporter=self.reporter,
            queue_limits=self.queue_limits,
            groups=self.groups,
            registry=self.registry,
            worker_id=self.worker_id,
            concurrency=concurrency,
            prefetch=prefetch,
            batch_size=batch_size,
            burst=burst,
            max_messages=max_messages,
            lease=lease,
            poll_interval=poll_interval,
            reseed_interval=reseed_interval,
            summary_interval=summary_interval,
        )
        self._abort = abort
        #: a first signal came (its stop may still be on its way)
        self._signalled = False

    def _init_parts(
        self, listeners: Sequence[Callable[[WorkerEvent], None]], stuck_grace: float
    ) -> None:
        """What it holds and the parts beside it, each with the narrow handles it needs."""
        #: what it holds (``slots``: see its module for the locking)
        self.slots = Slots(self.concurrency, self.prefetch)
        noted = (lambda name, message: self.intake.noted(name, message)) if self.burst else None
        self.reporter = Reporter(self.worker_id, listeners, noted=noted)
        self.listeners = self.reporter.listeners
        #: counters since the worker started (live; ``copy()`` for a snapshot)
        self.stats = self.reporter.stats
        self.leases = Leases()
        self.units: SimpleQueue[Unit | None] = SimpleQueue()
        #: the first BaseException (not an Exception) a receiver raised; run() re-raises it
        self.crashed: BaseException | None = None
        self.outcomes = Outcomes(self.reporter, self.leases, gone=lambda: self.intake.reseed_soon())
        self.time_limits = TimeLimits(
            self.slots, self.reporter, settle=self.outcomes.settle, grace=stuck_grace
        )
        self.queue_limits = QueueLimits(self.plans, self.slots)
        self.renewer = Renewer(self.slots, self.leases, self.reporter)
        self.runner = Runner(
            registry=self.registry,
            worker_id=self.worker_id,
            batch_size=self.batch_size,
            slots=self.slots,
            leases=self.leases,
            reporter=self.reporter,
            outcomes=self.outcomes,
            time_limits=self.time_limits,
        )

    @property
    def queue_labels(self) -> list[str]:
        return [p.label for p in self.plans]

    @property
    def stopping(self) -> bool:
        """``stop()`` was called (or a signal came): nothing more is received."""
        return self.slots.stopping

    def queue_health(self) -> dict[str, QueueHealth]:
        """Receive failures per queue (label): a queue whose receives fail (dropped, missing
        permission, unreachable) is ``failing`` and backs off alone while the others go on
        (live objects of the intake thread; read them, do not change them)."""
        return dict(self.intake.health)

    # --- run and stop -----------------------------------------------------------------------
    def stop(self) -> None:
        """Stop receiving; in-flight messages are finished and acked; ``run()`` returns."""
        self.slots.stop()

    def run(self) -> WorkerStats:
        """Run until stopped (or, with ``burst``, until nothing is due; or after
        ``max_messages``). Returns the final counters."""
        use_signals = (
            self.install_signal_handlers and threading.current_thread() is threading.main_thread()
        )
        with (
            on_stop(self._on_signal) if use_signals else contextlib.nullcontext(),
            heap_frozen(),
        ):
            threads = self._start_threads()
            logger.info(
                "worker %s started: queues=%s concurrency=%d",
                self.worker_id,
                ",".join(self.queue_labels),
                self.concurrency,
                extra={"action": "started"},
            )
            self.reporter.emit("worker_started")
            try:
                self.intake.seed()
                self.intake.run()
                # Ended by burst or max_messages: finish what is held, prefetched included
                # (a stop() meanwhile releases the messages not yet started).
                self.slots.wait_until(lambda: self.slots.stopping or self.slots.in_flight == 0)
            finally:
                self._shut_down(*threads)
                # what receivers left in the background (the relay's acks) ends here
                worker_stopped.send_robust(Worker, worker_id=self.worker_id)
            self.reporter.emit("summary", stats=self.stats.copy())
            self.reporter.emit("stopped", stats=self.stats.copy())
            logger.info("worker %s stopped", self.worker_id, extra={"action": "stopped"})
        self._raise_if_ended_badly()
        return self.stats.copy()

    def _start_threads(self) -> tuple[list[threading.Thread], threading.Thread, threading.Thread]:
        """Start the executor threads, the renewer and the watchdog."""
        executors = [
            threading.Thread(target=self._execute_units, name=f"sq-worker-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        renewer = threading.Thread(target=self.renewer.run, name="sq-renewer", daemon=True)
        watchdog = threading.Thread(target=self.time_limits.run, name="sq-watchdog", daemon=True)
        for thread in (*executors, renewer, watchdog):
            thread.start()
        return executors, renewer, watchdog

    def _shut_down(
        self,
        executors: list[threading.Thread],
        renewer: threading.Thread,
        watchdog: threading.Thread,
    ) -> None:
        """Stop; end the receive streams; wait until drained; end and join the threads (a
        stuck receiver's is not waited for: see ``limits``)."""
        self.stop()
        for plan in self.plans:  # no background RECEIVE stream outlives it
            try:
                plan.engine.stop_receiving(plan.model, wait=5)
            except Exception:
                logger.exception("stopping the receive stream of %s failed", plan.label)
        self.slots.wait_until(lambda: self.slots.drained)
        for _ in executors:
            self.units.put(None)
        for thread in executors:
            if thread.ident not in self.time_limits.stuck_threads:
                thread.join()
        with self.slots.cond:
            self.slots.renew_cond.notify_all()
        renewer.join()
        self.time_limits.wake.set()
        watchdog.join()

    def _raise_if_ended_badly(self) -> None:
        """``WorkerStuck`` when a receiver could not be interrupted, ``BurstFailed`` when a
        burst gave up on a failing queue, ``WorkerCrashed`` when a receiver raised a
        ``BaseException``."""
        if self.slots.stuck_units:
            raise WorkerStuck(
                f"worker {self.worker_id} stopped: {self.slots.stuck_units} receiver(s) still "
                f"running {self.time_limits.grace:g} s past their time limit could not be "
                "interrupted; restart the process"
            )
        if self.intake.gave_up:
            raise BurstFailed(
                f"worker {self.worker_id} gave up its burst: every receive failed on "
                f"{'; '.join(self.intake.gave_up)}"
            )
        if self.crashed is not None:
            raise WorkerCrashed(
                f"worker {self.worker_id} stopped: a receiver raised "
                f"{type(self.crashed).__name__}: {self.crashed}"
            ) from self.crashed

    # --- the executor threads ---------------------------------------------------------------
    def _execute_units(self) -> None:
        """An executor thread: take units from ``units`` and run them until told to end
        (None); a unit that may run in a group takes more with it (``Groups.run``, ``_pull``).
        A unit pulled that does not fit the group is the thread's next."""
        #: (a unit, whether it was taken already and is to be given back unstarted)
        next_: list[tuple[Unit | None, bool]] = []
        try:
            while True:
                unit, taken = next_.pop() if next_ else (self.units.get(), False)
                if unit is None:
                    return
                unstarted = taken or self.slots.take(unit)
                started = 0.0
                ran = [unit]
                try:
                    if unstarted:
                        run_now = self.outcomes.return_unstarted(unit)
                        if run_now:
                            self.runner._run_unit(unit[0].plan, run_now)
                    elif self.groups.wants(unit):
                        started = time.monotonic()
                        self.groups.run(unit, partial(self._pull, unit[0].plan, next_), ran)
                    else:
                        started = time.monotonic()
                        self.runner._run_unit(unit[0].plan, unit)
                except Exception:
                    logger.exception(
                        "worker error; message(s) left to lease expiry",
                        extra=self.reporter.log_extra("error", unit[0].message),
                    )
                except BaseException as exc:  # SystemExit, KeyboardInterrupt... from a receiver
                    self._crash([d for u in ran for d in u], exc)
                finally:
                    took = (time.monotonic() - started) / len(ran) if started else None
                    for u in ran:
                        self.slots.done(u, took)
                    recycle_connections()
        finally:
            connections.close_all()

    def _pull(self, plan: Plan, next_: list[tuple[Unit | None, bool]]) -> Unit | None:
        """A group's next unit: one waiting now (never waited for) of ``plan``'s queue that
        may join it; None when there is none (one that may not is the thread's next)."""
        if next_ or self.slots.stopping:
            return None
        try:
            unit = self.units.get_nowait()
        except Empty:
            return None
        if unit is None or unit[0].plan is not plan or not self.groups.wants(unit):
            next_.append((unit, False))
            return None
        if self.slots.take(unit):  # stopping meanwhile: given back, the thread's next
            next_.append((unit, True))
            return None
        return unit

    def _crash(self, unit: Unit, exc: BaseException) -> None:
        """A receiver raised a BaseException that is not an Exception: its transaction has
        rolled back; leave its messages leased (delivered again after their lease), stop the
        worker, and have ``run()`` raise ``WorkerCrashed``. The executor thread lives on to
        finish (or give back) the other units, as on ``stop()``."""
        for d in unit:
            logger.critical(
                "%s attempt %d: the receiver raised %s (%s); stopping the worker; the message "
                "is left leased and will be delivered again after its lease",
                d.message,
                d.message.attempt,
                type(exc).__name__,
                exc,
                exc_info=exc,
                extra=self.reporter.log_extra("crashed", d.message),
            )
            self.reporter.emit("crashed", message=d.message, error=exc)
        with self.slots.cond:
            if self.crashed is None:
                self.crashed = exc
        self.stop()

    # --- signals ----------------------------------------------------------------------------
    def _on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT (``on_stop``): the first stops the worker, a second one (even before
        the first stop has run) ends the process (``abort``)."""
        name = signal.Signals(signum).name
        if not (self._signalled or self.slots.stopping):
            self._signalled = True
            logger.warning(
                "%s received: finishing in-flight messages, then exiting (send it again to "
                "exit at once).",
                name,
                extra={"action": "stopping"},
            )
            # The stop runs on a thread of its own, not in the handler: the handler runs on
            # the main thread between two of its bytecodes, maybe inside a listener that
            # holds a plain lock (the health probes'), and the "stopping" event would wait
            # for that lock on the thread that holds it, for ever.
            threading.Thread(target=self._stop_on_signal, name="sq-stop", daemon=True).start()
        else:
            logger.warning(
                "%s received again: exiting now; unacked messages are redelivered after "
                "their lease.",
                name,
                extra={"action": "abort"},
            )
            self._abort()

    def _stop_on_signal(self) -> None:
        self.reporter.emit("stopping")
        self.stop()


def plan_queues(
    queues: Sequence[str | type[Queue]] | None,
    registry: ReceiverRegistry,
    batch_size: int,
    timeout: float | None = None,
) -> list[Plan]:
    """One ``Plan`` per queue to run (default: every queue that has receivers), with its
    database, engine, options and delivery policy; ``QueueConfigurationError`` for an unknown
    queue or one without receivers. ``timeout``: the time limit of receivers that set none."""
    by_queue = registry.by_queue()  # raises for receivers of undeclared queues
    if not by_queue:
        raise QueueConfigurationError(
            "No receivers are registered. Declare them with @receiver(Queue) in a "
            "'receivers' module of an installed app."
        )
    if queues:
        labels = []
        for queue in queues:
            label = get_queue(queue)._meta.label  # UnknownQueue for undeclared names
            if label not in by_queue:
                raise QueueConfigurationError(
                    f"Queue {label} has no receiver. Queues with receivers: "
                    f"{', '.join(sorted(by_queue))}."
                )
            if label not in labels:
                labels.append(label)
    else:
        labels = list(by_queue)
    plans = []
    for label in labels:
        specs = tuple(by_queue[label])
        batch = specs[0].batch
        size = max((s.max_batch_size or batch_size) for s in specs) if batch else 1
        model = get_queue(label)
        engine = engine_for(model)
        plans.append(
            Plan(
                model,
                specs,
                batch,
                size,
                db=api._database(model, None),
                engine=engine,
                options=queue_options(model),
                policy=DeliveryPolicy(engine),
                timeout=timeout,
            )
        )
    return plans


def _check_arguments(
    *,
    concurrency: int,
    prefetch: int | None,
    batch_size: int,
    max_messages: int | None,
    lease: timedelta | None,
    poll_interval: float,
    reseed_interval: float | None,
    timeout: float | None,
    stuck_grace: float,
) -> None:
    """``InvalidArgument`` for a ``Worker`` argument out of its range."""
    _require_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
    if prefetch is not None:
        _require_int("prefetch", prefetch, 1, MAX_PREFETCH)
    _require_int("batch_size", batch_size, 1, None)
    if max_messages is not None:
        _require_int("max_messages", max_messages, 1, None)
    if lease is not None and (not isinstance(lease, timedelta) or lease <= timedelta(0)):
        raise InvalidArgument(f"lease must be a positive timedelta, not {lease!r}.")
    if not isinstance(poll_interval, (int, float)) or not poll_interval >= 0:
        raise InvalidArgument(f"poll_interval must be >= 0, not {poll_interval!r}.")
    if reseed_interval is not None and (
        not isinstance(reseed_interval, (int, float)) or not reseed_interval > 0
    ):
        raise InvalidArgument(f"reseed_interval must be > 0, not {reseed_interval!r}.")
    if timeout is not None and not _positive_seconds(timeout):
        raise InvalidArgument(f"timeout must be a positive number of seconds, not {timeout!r}.")
    if not _positive_seconds(stuck_grace):
        raise InvalidArgument(f"stuck_grace must be a positive number, not {stuck_grace!r}.")


def _require_int(name: str, value: Any, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidArgument(f"{name} must be an int of at least {low}, not {value!r}.")
    if high is not None and value > high:
        raise InvalidArgument(
            f"{name} must be at most {high}, not {value} (each receiver thread holds a database "
            "connection; run more worker processes instead)."
        )


def _positive_seconds(value: Any) -> bool:
    return (
        not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < float("inf")
    )


@contextlib.contextmanager
def on_stop(callback: Callable[[int], None]) -> Iterator[None]:
    """Call ``callback(signum)`` on SIGINT/SIGTERM inside the block; restore the previous
    handlers afterwards (procrastinate's ``on_stop``)."""
    signums = [signal.SIGINT, signal.SIGTERM]
    previous = {s: signal.getsignal(s) for s in signums}
    for s in signums:
        signal.signal(s, lambda signum, frame: callback(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


_frozen_lock = threading.Lock()
#: workers running in this process, and whether the first of them froze the heap
_frozen = {"runs": 0, "ours": False}


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """While a worker runs, the objects the process held when the first running worker
    started are left out of the cyclic garbage collector's scans (``gc.freeze()``, given back
    with ``gc.unfreeze()`` when the last running worker returns; nothing is done where the
    process had frozen objects of its own, a pre-fork server's). A worker allocates a few
    dozen objects a message, and each full collection walked the whole heap of Django, the
    drivers and the project: on SQLite 16-21 us of the 80-85 us of CPU a message went to the
    collector, 7 us after. Nothing is freed that would not be; a cycle among those objects
    that becomes garbage during the run is collected after it."""
    with _frozen_lock:
        _frozen["runs"] += 1
        if _frozen["runs"] == 1 and gc.get_freeze_count() == 0:
            gc.freeze()
            _frozen["ours"] = True
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen["runs"] -= 1
            if _frozen["runs"] == 0 and _frozen["ours"]:
                gc.unfreeze()
                _frozen["ours"] = False
