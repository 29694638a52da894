"""The worker: receive messages, run receivers, ack, retry, renew leases, stop gracefully.

``Worker`` is a plain class; ``manage.py runqueueworker`` is a thin adapter over it. This module
is the worker, top to bottom: what it holds and its slot accounting, the intake (receive,
prefetch, a failing queue's back-off), the executor threads (run receivers, ack in their
transaction) and its signal handling. Beside it: ``outcomes`` (the delivery policy: retry,
failure, dead letter, discard, give-back), ``leases`` (the renewer thread), ``limits`` (time
limits, per-queue concurrency and rate), ``events`` (events, counters, listeners) and
``health`` (``/livez``, ``/readyz``). Guarantees:

- It never holds more messages than it has free slots: ``concurrency`` threads, each holding
  up to ``prefetch`` units (a batch queue fills one slot with up to ``batch_size`` messages).
  One receive claims up to ``concurrency * prefetch`` minus those held, and, past one unit per
  thread, claims again only when fewer than ``concurrency`` are left waiting. By default
  (``prefetch=None``) the prefetch adapts: one unit per free thread until a unit was timed,
  then, while receives come back full, doubling up to what a thread can start within
  ``min(AHEAD_SECONDS, lease / 2)`` at the measured average run time (at most
  ``AUTO_PREFETCH_MAX``); it drops at once when receivers slow down, and slow receivers take
  one. ``prefetch=N`` fixes it (1: claim only for free threads). Each message is still
  processed on its own, in its own transaction with its ack; waiting messages' leases are
  renewed like running ones; a waiting message whose lease was lost or has expired is not run.
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

How one message goes: the intake receives it into a slot (``slots.Slots.hold``) as a
``Delivery`` of its queue's ``Plan`` (database, engine, options, delivery policy); an executor
takes it (``Slots.take``), its ``run.Runner`` runs its receiver (``_run``: in the receiver's
transaction with its ack when ``atomic``), which returns one ``outcomes.Outcome`` per message
(acked, retry, failed, timed out, lease lost, already acked; before a run: unmatched,
exhausted, lease lost); one function, ``Outcomes.settle``, applies the delivery policy to them;
the slot is freed (``Slots.done``). A single message whose receiver may be grouped runs with
more of its queue's messages waiting, in one transaction and one commit (``group.Groups``).
The parts beside the worker hold narrow handles, never the ``Worker``: a ``Reporter``
(events, counters, log fields), the ``Slots``, the ``Leases``, the plans.

Locking: ``Slots.cond`` (and ``renew_cond``, on the same lock) guard the slot accounting, which
changes in ``Slots``'s own methods only (see ``slots``). ``Leases.lock`` is held by a renewal,
and by whoever reads a delivery's lease token to ack, retry, release or dead-letter it
(``Leases.freeze``), so the token acked with is the row's until the ack commits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any

from django.db import connections

from spanner_queues import api, clock, controls
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import (
    InvalidArgument,
    QueueConfigurationError,
    WorkerCrashed,
    WorkerStuck,
)
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.patterns import seed_schedules
from spanner_queues.queues import get_queue
from spanner_queues.receivers import (
    ReceiverRegistry,
    receivers,
)
from spanner_queues.transactions import (
    forget_lost_connection,
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
from spanner_queues.worker.leases import Leases, Renewer, renew_at
from spanner_queues.worker.limits import (
    STUCK_GRACE_SECONDS,
    QueueLimits,
    TimeLimits,
)
from spanner_queues.worker.run import Runner
from spanner_queues.worker.slots import Delivery, Plan, Slots, Unit

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
#: adaptive prefetch: most seconds of work one thread holds waiting (at the measured average)
AHEAD_SECONDS = 0.25
#: adaptive prefetch: most units one thread holds
AUTO_PREFETCH_MAX = 100
#: a failing queue is asked again after max(poll_interval, MIN) x 2^failures seconds, at
#: most MAX (jittered down by a quarter)
QUEUE_BACKOFF_MIN = 0.1
QUEUE_BACKOFF_MAX = 5.0
#: seconds a wait of the main thread lasts at most before it looks again (signal handlers run)
SIGNAL_SLICE = 0.2
#: burst: most keys of messages given back unmatched that a worker remembers (past it, such a
#: message found again counts as work, and the burst goes on while it keeps falling due)
BURST_UNMATCHED_KEPT = 10_000


@dataclass(slots=True)
class QueueHealth:
    """Receive failures of one queue of a worker, in a row (a failure *episode*): while
    ``failures`` > 0 the queue is failing and is not asked again before ``retry_at``
    (monotonic); the worker's other queues go on. A receive that succeeds ends the episode."""

    label: str
    #: failed receives in a row (0: healthy)
    failures: int = 0
    #: monotonic time of the episode's first failure
    since: float | None = None
    #: monotonic time before which the queue is not asked again
    retry_at: float = 0.0
    #: the latest error of the episode
    error: BaseException | None = None

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def describe(self, now: float) -> str:
        """``"Q (UnknownQueue: ..., 3 failures in 12 s)"`` for the worker's summary line."""
        error = f"{type(self.error).__name__}: {self.error}" if self.error else "error"
        if len(error) > 120:
            error = error[:117] + "..."
        took = now - self.since if self.since is not None else 0.0
        return f"{self.label} ({error}; {self.failures} failures in {took:.0f} s)"


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
        self.max_messages = max_messages
        self.lease = lease
        self.poll_interval = poll_interval
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.registry = registry if registry is not None else receivers
        self.install_signal_handlers = install_signal_handlers
        self.summary_interval = summary_interval
        #: seconds between re-seeds of the periodic schedules while running (None: at start only)
        self.reseed_interval = reseed_interval
        #: time limit in seconds of receivers that set none (None: no limit)
        self.timeout = timeout
        self.plans: list[Plan] = plan_queues(queues, self.registry, batch_size, timeout)
        self._init_intake()
        self._init_parts(listeners, stuck_grace)
        #: group commit (``group``): messages per commit and receiver time per group of
        #: queues that set none (None: ``DEFAULT_GROUP_SIZE``, ``DEFAULT_GROUP_MS``)
        self.groups = Groups(self.runner, size=group_size, ms=group_ms)
        self._abort = abort
        #: a first signal came (its stop may still be on its way)
        self._signalled = False

    def _init_parts(
        self, listeners: Sequence[Callable[[WorkerEvent], None]], stuck_grace: float
    ) -> None:
        """What it holds and the parts beside it, each with the narrow handles it needs."""
        #: what it holds (``slots``: see its module for the locking)
        self.slots = Slots(self.concurrency, self.prefetch)
        noted = self._noted if self.burst else None
        self.reporter = Reporter(self.worker_id, listeners, noted=noted)
        self.listeners = self.reporter.listeners
        #: counters since the worker started (live; ``copy()`` for a snapshot)
        self.stats = self.reporter.stats
        self.leases = Leases()
        self.units: SimpleQueue[Unit | None] = SimpleQueue()
        #: the first BaseException (not an Exception) a receiver raised; run() re-raises it
        self.crashed: BaseException | None = None
        self.outcomes = Outcomes(self.reporter, self.leases, gone=self._reseed_soon)
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

    def _init_intake(self) -> None:
        """The intake's own (its thread's) state."""
        #: units each thread may hold now (adaptive: see ``_adapt``)
        self.depth = 1 if self.prefetch is None else self.prefetch
        #: the lease the last receive got, in seconds (None: the engine gives none)
        self.lease_seconds: float | None = None
        #: labels of this worker's queues paused by an operator (``controls``): read before the
        #: first round, then every ``PAUSE_CHECK_SECONDS`` by the ``sq-pauses`` thread (a read
        #: that waits out a database outage never holds up the intake or a stop)
        self.paused: frozenset[str] = frozenset()
        #: monotonic time of the next re-seed of periodic schedules (0: at the next round)
        self.next_seed = 0.0
        #: receive failures per queue (label): each queue fails, backs off and recovers alone
        self._health = {p.label: QueueHealth(p.label) for p in self.plans}
        #: burst: keys of the messages given back because no receiver of this worker matches
        #: them, by queue label (at most ``BURST_UNMATCHED_KEPT`` in all): found again, they
        #: are no work of this worker's, and the burst may end with them in the queue
        self.unmatched_keys: dict[str, set[tuple[Any, ...]]] = {p.label: set() for p in self.plans}
        self._unmatched_kept = 0
        self._next_summary: float | None = None

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
        return dict(self._health)

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
        with on_stop(self._on_signal) if use_signals else contextlib.nullcontext():
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
                self._seed()
                self._receive_loop()
                # Ended by burst or max_messages: finish what is held, prefetched included
                # (a stop() meanwhile releases the messages not yet started).
                self._wait(lambda: self.slots.stopping or self.slots.in_flight == 0)
            finally:
                self._shut_down(*threads)
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
        for label in self.queue_labels:  # no background RECEIVE stream outlives it
            try:
                api.stop_receiving(label, wait=5)
            except Exception:
                logger.exception("stopping the receive stream of %s failed", label)
        self._wait(lambda: self.slots.drained)
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
        """``WorkerStuck`` when a receiver could not be interrupted, ``WorkerCrashed`` when one
        raised a ``BaseException``."""
        if self.slots.stuck_units:
            raise WorkerStuck(
                f"worker {self.worker_id} stopped: {self.slots.stuck_units} receiver(s) still "
                f"running {self.time_limits.grace:g} s past their time limit could not be "
                "interrupted; restart the process"
            )
        if self.crashed is not None:
            raise WorkerCrashed(
                f"worker {self.worker_id} stopped: a receiver raised "
                f"{type(self.crashed).__name__}: {self.crashed}"
            ) from self.crashed

    def _wait(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()`` (checked under ``cond``), in ``SIGNAL_SLICE`` slices: CPython
        runs a signal handler only on the main thread, and a SIGTERM the kernel gave another
        thread does not wake a wait with no timeout (the stop waited for the running receiver,
        120 s)."""
        with self.slots.cond:
            while not self.slots.cond.wait_for(done, timeout=SIGNAL_SLICE):
                pass

    # --- the intake (the thread that called run) --------------------------------------------
    def _receive_loop(self) -> None:
        """Claim while there are free slots, until stopped (or, with ``burst``, until a whole
        round finds nothing due while nothing is held, no queue is failing and every engine
        says no row is leased to this process and unread and its last look at the queue found
        nothing due but messages this worker gave back unmatched, ``api.settle_receiving``;
        or after ``max_messages``). Serving several queues a receive only takes what a stream
        holds (``_receive``): an empty round is no proof, the engines' look is. Between
        rounds it re-seeds the periodic schedules and emits summaries. A queue whose receive
        raises fails alone (``_queue_failed``): it backs off, the others go on. A queue at
        its limit (``limits.QueueLimits``) is skipped."""
        slots = self.slots
        start = 0
        if self.summary_interval:
            self._next_summary = time.monotonic() + self.summary_interval
        if self.burst:
            self._settled(wait=0)  # from now on, streams receive in calls that end on their own
        self._check_paused()  # a worker started while a queue is paused never receives from it
        threading.Thread(target=self._watch_pauses, name="sq-pauses", daemon=True).start()
        while True:
            with slots.cond:
                self._wait(lambda: slots.stopping or self._wants_more())
                if slots.stopping:
                    return
                idle_before = slots.in_flight == 0
            self._between_rounds()
            got = self._round(start)
            start += 1
            if self.max_messages is not None and self.stats.received >= self.max_messages:
                return
            if not got and self._nothing_came(idle_before):
                return

    def _between_rounds(self) -> None:
        """Re-seed the periodic schedules and emit a summary, when each is due."""
        if self.reseed_interval is not None and time.monotonic() >= self.next_seed:
            self._seed()
        if self._next_summary is not None and time.monotonic() >= self._next_summary:
            self.reporter.emit("summary", stats=self.stats.copy())
            self._next_summary = time.monotonic() + (self.summary_interval or 0)

    def _round(self, start: int) -> int:
        """One round over the queues, from the ``start``-th: receive from each that is not
        paused, backing off or at its limit while slots are free. Returns how many came."""
        got = 0
        for offset in range(len(self.plans)):
            plan = self.plans[(start + offset) % len(self.plans)]
            health = self._health[plan.label]
            if plan.label in self.paused or (health.failing and time.monotonic() < health.retry_at):
                continue  # paused, or backing off: the other queues go on
            with self.slots.cond:
                free = self.slots.free(self.depth)
            if free <= 0 or self.slots.stopping:
                break
            want = self._want(plan, free)
            if want <= 0:
                break
            try:
                want = self.queue_limits.admit(plan, want)
                if want <= 0:
                    continue  # this queue is at its limit: the others may go on
                n = self._receive(plan, want)
            except Exception as exc:
                self._queue_failed(health, exc)
                continue
            self.queue_limits.received(plan, n)
            if health.failing:
                self._queue_recovered(health)
            got += n
            if self.prefetch is None:
                self._adapt(full=n >= want)
        return got

    def _want(self, plan: Plan, free: int) -> int:
        """How many messages of ``plan`` to ask for with ``free`` slots."""
        if plan.batch:
            want = plan.batch_size
        elif self.depth == 1:
            want = min(free, self.batch_size)
        else:
            want = free
        if self.max_messages is not None:
            want = min(want, self.max_messages - self.stats.received)
        return want

    def _nothing_came(self, idle_before: bool) -> bool:
        """A round received nothing: wait before the next (a poll interval, a failing queue's
        retry, a rate-limited queue's bucket). True: the burst is over."""
        failing = [h for h in self._health.values() if h.failing]
        if self.burst and not failing:
            return self._burst_idle(idle_before)
        self.reporter.emit("idle")
        wait = self.poll_interval * random.uniform(0.5, 1.0)
        if failing and len(failing) == len(self.plans):  # nothing to ask before a retry
            wait = max(wait, min(h.retry_at for h in failing) - time.monotonic())
        bucket_wait = self.queue_limits.next_free()  # a rate-limited queue waits its bucket
        if bucket_wait is not None:  # ... no longer than until it has a start again
            wait = min(wait, bucket_wait)
        self._idle_wait(wait)
        recycle_connections()
        return False

    def _burst_idle(self, idle_before: bool) -> bool:
        """Burst, and a round found nothing: True (over) when nothing was in flight and every
        queue is settled; else wait for a bucket or for in-flight work to finish."""
        bucket_wait = self.queue_limits.next_free()
        if bucket_wait is not None:  # a rate-limited queue waits for its bucket
            self._idle_wait(min(bucket_wait, 0.2))
            return False
        if idle_before:
            # A whole round found nothing while nothing was in flight: stop once no row is
            # leased to this process and unread, and each engine's last look found nothing
            # due but what this worker gave back unmatched.
            if self._settled():
                self._burst_ended()
                return True
            return False
        slots = self.slots
        with slots.cond:  # wait for in-flight work to finish, then look again (none in
            # flight: all finished during this round's receive; look again at once)
            floor = max(slots.in_flight, 1)
            slots.cond.wait_for(lambda: slots.stopping or slots.in_flight < floor, timeout=1.0)
        return False

    def _wants_more(self) -> bool:
        # depth 1: a free thread. Otherwise also fewer units waiting than threads, so that
        # a claim takes many messages at once rather than one each time one finishes.
        return self.slots.free(self.depth) > 0 and self.slots.waiting < self.concurrency

    def _idle_wait(self, seconds: float) -> None:
        with self.slots.cond:
            self.slots.cond.wait_for(lambda: self.slots.stopping, timeout=seconds)

    def _receive(self, plan: Plan, want: int) -> int:
        """Receive up to ``want`` messages of ``plan``'s queue into slots (``Slots.hold``) and
        onto ``units``; messages whose lease already expired are skipped. Returns how many
        came."""
        # Serving several queues, a receive takes what a queue's stream holds now: waiting on
        # one queue's stream (native queues) held up every other, and a round over N idle
        # queues took N waits (30 queues: 15 s before a task was run). The streams go on
        # receiving in the background; the next round, ``poll_interval`` later, takes it.
        wait = 0.0 if len(self.plans) > 1 else None
        messages = api.receive(plan.model, max_messages=want, lease=self.lease, wait=wait)
        if not messages:
            return 0
        now = clock.now()
        expires = messages[0].lease_expires_at
        self.lease_seconds = None if expires is None else (expires - now).total_seconds()
        fresh = [m for m in messages if m.lease_expires_at is None or m.lease_expires_at > now]
        if len(fresh) < len(messages):  # sat too long in a buffer: someone else's now
            logger.warning(
                "%d received message(s) of %s had an expired lease; skipped",
                len(messages) - len(fresh),
                plan.label,
                extra={"action": "lease_expired", "queue": plan.label, "worker_id": self.worker_id},
            )
        deliveries = [Delivery(m, plan, renew_at(m, now)) for m in fresh]
        units = [deliveries] if plan.batch else [[d] for d in deliveries]
        units = [u for u in units if u]
        self.reporter.count("received", len(messages))
        self.slots.hold(plan.label, units)
        for unit in units:
            for d in unit:
                self.reporter.emit("received", message=d.message)
            self.units.put(unit)
        return len(messages)

    def _adapt(self, *, full: bool) -> None:
        """Adaptive prefetch: after a receive, ``depth`` becomes what one thread may hold,
        ``fit = min(AHEAD_SECONDS, lease / 2) / unit_seconds`` (with groups, ``AHEAD_SECONDS`` or
        two groups' time, whichever is longer) (at least 1, at most
        ``AUTO_PREFETCH_MAX``), so that what a thread holds starts well before its lease ends:
        doubling towards it after a receive that came back ``full`` (a backlog), at once down
        to it when receivers slow down. Nothing timed yet: one per free thread."""
        took = self.slots.unit_seconds
        if took is None:
            return
        # a thread that groups holds what two of its groups run (their messages wait for it);
        # AHEAD_SECONDS = 0 holds nothing ahead, groups or not
        groups = 2 * self.groups.longest(self.plans)
        ahead = max(AHEAD_SECONDS, groups) if AHEAD_SECONDS > 0 else 0.0
        budget = ahead if self.lease_seconds is None else min(ahead, self.lease_seconds / 2)
        if took > 0:
            fit = max(1, min(AUTO_PREFETCH_MAX, int(budget / took)))
        else:  # too quick for the clock
            fit = AUTO_PREFETCH_MAX if budget > 0 else 1
        self.depth = min(self.depth * 2, fit) if full else min(self.depth, fit)

    def _seed(self) -> None:
        """Send the first run of every ``periodic`` schedule of this worker's queues whose
        message is missing (at start, every ``reseed_interval`` and after a message was
        dead-lettered or discarded): a schedule whose message was dead-lettered, discarded
        or deleted starts again without a restart."""
        if self.reseed_interval is not None:
            self.next_seed = time.monotonic() + self.reseed_interval
        try:
            for message in seed_schedules(self.queue_labels, registry=self.registry):
                logger.info("seeded periodic schedule %s", message, extra={"action": "seeded"})
        except Exception:
            logger.exception("seeding periodic schedules failed", extra={"action": "error"})

    def _watch_pauses(self) -> None:
        """The pause watcher thread: ``_check_paused`` every ``PAUSE_CHECK_SECONDS`` until the
        worker stops."""
        try:
            while True:
                with self.slots.cond:
                    if self.slots.cond.wait_for(
                        lambda: self.slots.stopping, timeout=controls.PAUSE_CHECK_SECONDS
                    ):
                        return
                self._check_paused()
        finally:
            connections.close_all()

    def _check_paused(self) -> None:
        """Read which of this worker's queues are paused; stop the background receiving of a
        queue once it is paused, so rows it leased and nobody started go back. A failed read
        keeps the last answer."""
        try:
            now_paused = set(controls.paused(p.model for p in self.plans))
        except Exception:
            logger.exception("reading paused queues failed", extra={"action": "error"})
            return
        for plan in self.plans:
            if plan.label in now_paused and plan.label not in self.paused:
                logger.info(
                    "%s is paused: not receiving from it until it is resumed",
                    plan.label,
                    extra={"action": "paused", "queue": plan.label},
                )
                api.stop_receiving(plan.model, wait=0)
            elif plan.label in self.paused and plan.label not in now_paused:
                logger.info(
                    "%s was resumed", plan.label, extra={"action": "resumed", "queue": plan.label}
                )
        self.paused = frozenset(now_paused)

    def _queue_failed(self, health: QueueHealth, exc: Exception) -> None:
        """A receive of ``health``'s queue raised: back it off alone (``QUEUE_BACKOFF_*``,
        doubling per failure in a row). Logged once per episode (a warning with the
        traceback); later failures of the episode at debug level. A lost database connection
        is closed, so the next receive reconnects."""
        plan = next(p for p in self.plans if p.label == health.label)
        forget_lost_connection(exc, plan.db)
        now = time.monotonic()
        health.failures += 1
        health.error = exc
        if health.since is None:
            health.since = now
        # (the exponent is capped: a float times 2**1024 overflows, after ~75 min of failures)
        doubled = max(self.poll_interval, QUEUE_BACKOFF_MIN) * 2 ** min(health.failures, 64)
        health.retry_at = now + min(QUEUE_BACKOFF_MAX, doubled) * random.uniform(0.75, 1.0)
        self.reporter.count("receive_errors")
        if health.failures == 1:
            logger.warning(
                "receive from %s failed (%s: %s); backing off, the worker's other queues go "
                "on; further failures of %s are logged at debug level until it recovers",
                health.label,
                type(exc).__name__,
                exc,
                health.label,
                exc_info=exc,
                extra={"action": "queue_failing", "queue": health.label},
            )
        else:
            logger.debug(
                "receive from %s failed again (%d in a row): %s: %s",
                health.label,
                health.failures,
                type(exc).__name__,
                exc,
                extra={"action": "queue_failing", "queue": health.label},
            )
        self.reporter.emit("receive_failed", queue=health.label, error=exc)

    def _queue_recovered(self, health: QueueHealth) -> None:
        """A receive of a failing queue succeeded: the episode ends (logged once)."""
        took = time.monotonic() - (health.since or time.monotonic())
        logger.info(
            "receive from %s recovered after %d failures in %.1f s",
            health.label,
            health.failures,
            took,
            extra={"action": "queue_recovered", "queue": health.label},
        )
        health.failures = 0
        health.since = None
        health.error = None
        health.retry_at = 0.0
        self.reporter.emit("queue_recovered", queue=health.label)

    def _settled(self, wait: float | None = None) -> bool:
        """No queue of this worker has rows leased to this process and unread, and each
        engine's last look found nothing due but messages this worker gave back unmatched
        (``api.settle_receiving``). Every queue is asked at once first (``wait=0``: their
        looks run together, one brief call's time, not one per queue), then each is waited
        for. A queue whose settle raises is failing (``_queue_failed``): not settled."""
        pending = []
        for plan in self.plans:
            if not self._settle(plan, 0):
                pending.append(plan)
        if wait == 0:
            return not pending
        return all([self._settle(plan, wait) for plan in pending])

    def _settle(self, plan: Plan, wait: float | None) -> bool:
        try:
            return api.settle_receiving(
                plan.model, wait=wait, ignore=self.unmatched_keys[plan.label]
            )
        except Exception as exc:
            self._queue_failed(self._health[plan.label], exc)
            return False

    def _burst_ended(self) -> None:
        """Log why a burst ends: nothing is due, but messages no receiver of this worker
        matches may be left (given back, due again after their back-off)."""
        left = {label: len(keys) for label, keys in self.unmatched_keys.items() if keys}
        if not left:
            logger.info("burst: nothing due; exiting", extra={"action": "burst_ended"})
            return
        logger.warning(
            "burst: nothing due but %s: message(s) no receiver of this worker matches, "
            "given back and left to a worker that has its receiver; exiting",
            ", ".join(f"{n} of {label}" for label, n in sorted(left.items())),
            extra={"action": "burst_ended"},
        )

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

    # --- events -----------------------------------------------------------------------------
    def _noted(self, name: str, message: Message) -> None:
        """A burst worker remembers the messages given back unmatched (``unmatched_keys``)."""
        if name != "unmatched":
            return
        with self.slots.cond:
            keys = self.unmatched_keys.get(message.queue)
            if keys is None or message.key in keys:
                return
            if self._unmatched_kept < BURST_UNMATCHED_KEPT:
                keys.add(message.key)
                self._unmatched_kept += 1

    def _reseed_soon(self) -> None:
        """A message left its queue for good (dead-lettered, discarded): re-seed the periodic
        schedules at the next round."""
        self.next_seed = 0.0

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
