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

Locking: ``cond`` (and ``renew_cond``, on the same lock) guard the counters, ``deliveries`` and
``stopping``. The slot accounting (``in_flight``, ``waiting``, ``by_queue``, ``deliveries``,
``unit_seconds``) changes in three methods only: ``_hold`` (the intake's claim), ``_take`` and
``_done`` (an executor's). ``renew_lock`` is held by a renewal, and by whoever reads a
delivery's lease token to ack, retry, release or dead-letter it (``freeze``), so the token
acked with is the row's until the ack commits.
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
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections

from spanner_queues import api, clock, controls
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import (
    AckedFailure,
    InvalidArgument,
    LeaseLost,
    MessageAlreadyAcked,
    QueueConfigurationError,
    Retry,
    TimeLimitExceeded,
    WorkerCrashed,
    WorkerStuck,
)
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.patterns import seed_schedules
from spanner_queues.queues import get_queue
from spanner_queues.receivers import (
    MessageContext,
    NoReceiver,
    ReceiverRegistry,
    ReceiverSpec,
    call,
    receivers,
    running,
)
from spanner_queues.transactions import (
    forget_lost_connection,
    holding,
    recycle_connections,
    run_in_transaction,
)
from spanner_queues.worker.events import (
    FINAL_EVENTS,
    WorkerEvent,
    WorkerEvents,
    WorkerStats,
    log_extra,
)
from spanner_queues.worker.leases import Renewer, renew_at
from spanner_queues.worker.limits import (
    STUCK_GRACE_SECONDS,
    QueueLimits,
    TimeLimits,
    time_limit_exceeded,
)
from spanner_queues.worker.outcomes import PARKED_UNTIL, DeliveryPolicy, Outcomes

if TYPE_CHECKING:
    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions

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

T = TypeVar("T")

#: most receiver threads one worker process runs (each is a thread and a database connection)
MAX_CONCURRENCY = 1024
#: most units each thread may hold (prefetch)
MAX_PREFETCH = 1000
#: adaptive prefetch: most seconds of work one thread holds waiting (at the measured average)
AHEAD_SECONDS = 0.25
#: adaptive prefetch: most units one thread holds
AUTO_PREFETCH_MAX = 100
#: weight of the latest unit in the moving average of unit durations (``unit_seconds``)
EWMA_WEIGHT = 0.2
#: a failing queue is asked again after max(poll_interval, MIN) x 2^failures seconds, at
#: most MAX (jittered down by a quarter)
QUEUE_BACKOFF_MIN = 0.1
QUEUE_BACKOFF_MAX = 5.0
#: seconds a wait of the main thread lasts at most before it looks again (signal handlers run)
SIGNAL_SLICE = 0.2
#: burst: most keys of messages given back unmatched that a worker remembers (past it, such a
#: message found again counts as work, and the burst goes on while it keeps falling due)
BURST_UNMATCHED_KEPT = 10_000


@dataclass(eq=False, slots=True)
class Delivery:
    """A message this worker holds, with its current (possibly renewed) lease."""

    message: Message
    model: type[Queue]
    renew_at: datetime | None
    lease_lost: bool = False
    done: bool = False
    #: set (under the renew lock) once an ack, retry or dead letter read this delivery's lease
    #: token: the renewer no longer rotates it, so the token acked with is the row's until the
    #: ack commits (a rotation in between would make the ack stale, and on Spanner a replayed
    #: ack transaction could then commit without its DELETE)
    acking: bool = False
    #: claimed ahead of a free thread (prefetch): given back, not run, if the worker stops
    #: before it starts
    ahead: bool = False
    #: monotonic time past which its receiver is interrupted (``limits``; None: no limit)
    deadline: float | None = None
    #: its receiver ran past the time limit: not renewed, not acked
    timed_out: bool = False
    #: its receiver could not be interrupted within the grace: the worker gave up on it
    stuck: bool = False


#: a unit: one message, or the messages of one batch; None tells an executor to end
Unit = list[Delivery]


@dataclass(frozen=True, slots=True)
class Plan:
    """One queue this worker runs: its receivers, and how many messages make a unit."""

    model: type[Queue]
    specs: tuple[ReceiverSpec, ...]
    batch: bool
    batch_size: int

    @property
    def label(self) -> str:
        return self.model._meta.label


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
    ) -> None:
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
        self.plans: list[Plan] = plan_queues(queues, self.registry, batch_size)
        self.listeners = list(listeners)
        #: counters since the worker started (live; ``copy()`` for a snapshot)
        self.stats = WorkerStats()

        # What it holds (see the module docstring for the locking).
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        #: the renewer's own wake-ups (new deliveries, stop), not one per finished message
        self.renew_cond = threading.Condition(lock)
        self.renew_lock = threading.RLock()
        self.stopping = False
        self.in_flight = 0  # units (slots) taken, running or waiting
        self.waiting = 0  # units received and not yet taken by an executor
        #: moving average of the seconds one unit takes to run and ack (None: none ran yet)
        self.unit_seconds: float | None = None
        self.deliveries: set[Delivery] = set()  # held: running or waiting
        #: messages held (running or waiting) by queue label, for ``QueueMeta.concurrency_limit``
        self.by_queue: Counter[str] = Counter()
        self.units: SimpleQueue[Unit | None] = SimpleQueue()
        #: the first BaseException (not an Exception) a receiver raised; run() re-raises it
        self.crashed: BaseException | None = None
        #: units whose receiver could not be interrupted past its time limit (``limits``):
        #: the worker stops without waiting for them
        self.stuck_units = 0
        self._per_queue: dict[type[Queue], tuple[str, Any, QueueOptions]] = {}

        # The intake's own (its thread's) state.
        #: units each thread may hold now (adaptive: see ``_adapt``)
        self.depth = 1 if prefetch is None else prefetch
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

        self.outcomes = Outcomes(self)
        self.time_limits = TimeLimits(self, grace=stuck_grace)
        self.queue_limits = QueueLimits(self)
        self.renewer = Renewer(self)
        self._abort = abort
        #: a first signal came (its stop may still be on its way)
        self._signalled = False

    @property
    def queue_labels(self) -> list[str]:
        return [p.label for p in self.plans]

    def queue_health(self) -> dict[str, QueueHealth]:
        """Receive failures per queue (label): a queue whose receives fail (dropped, missing
        permission, unreachable) is ``failing`` and backs off alone while the others go on
        (live objects of the intake thread; read them, do not change them)."""
        return dict(self._health)

    # --- run and stop -----------------------------------------------------------------------
    def stop(self) -> None:
        """Stop receiving; in-flight messages are finished and acked; ``run()`` returns."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            self.renew_cond.notify_all()

    def run(self) -> WorkerStats:
        """Run until stopped (or, with ``burst``, until nothing is due; or after
        ``max_messages``). Returns the final counters."""
        use_signals = (
            self.install_signal_handlers and threading.current_thread() is threading.main_thread()
        )
        with on_stop(self._on_signal) if use_signals else contextlib.nullcontext():
            executors = [
                threading.Thread(target=self._execute_units, name=f"sq-worker-{i}", daemon=True)
                for i in range(self.concurrency)
            ]
            renewer = threading.Thread(target=self.renewer.run, name="sq-renewer", daemon=True)
            watchdog = threading.Thread(
                target=self.time_limits.run, name="sq-watchdog", daemon=True
            )
            for thread in (*executors, renewer, watchdog):
                thread.start()
            logger.info(
                "worker %s started: queues=%s concurrency=%d",
                self.worker_id,
                ",".join(self.queue_labels),
                self.concurrency,
                extra={"action": "started"},
            )
            self.emit("worker_started")
            try:
                self._seed()
                self._receive_loop()
                # Ended by burst or max_messages: finish what is held, prefetched included
                # (a stop() meanwhile releases the messages not yet started).
                self._wait(lambda: self.stopping or self.in_flight == 0)
            finally:
                self.stop()
                for label in self.queue_labels:  # no background RECEIVE stream outlives it
                    try:
                        api.stop_receiving(label, wait=5)
                    except Exception:
                        logger.exception("stopping the receive stream of %s failed", label)
                # (a stuck receiver is not waited for: see limits)
                self._wait(lambda: self.drained)
                for _ in executors:
                    self.units.put(None)
                for thread in executors:
                    if thread.ident not in self.time_limits.stuck_threads:
                        thread.join()
                with self.cond:
                    self.renew_cond.notify_all()
                renewer.join()
                self.time_limits.wake.set()
                watchdog.join()
            self.emit("summary", stats=self.stats.copy())
            self.emit("stopped", stats=self.stats.copy())
            logger.info("worker %s stopped", self.worker_id, extra={"action": "stopped"})
        if self.stuck_units:
            raise WorkerStuck(
                f"worker {self.worker_id} stopped: {self.stuck_units} receiver(s) still "
                f"running {self.time_limits.grace:g} s past their time limit could not be "
                "interrupted; restart the process"
            )
        if self.crashed is not None:
            raise WorkerCrashed(
                f"worker {self.worker_id} stopped: a receiver raised "
                f"{type(self.crashed).__name__}: {self.crashed}"
            ) from self.crashed
        return self.stats.copy()

    @property
    def drained(self) -> bool:
        """Stopping, and holding nothing but the units of stuck receivers (read under
        ``cond``): the renewer, the watchdog and ``run()`` end."""
        return self.stopping and self.in_flight <= self.stuck_units

    def _wait(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()`` (checked under ``cond``), in ``SIGNAL_SLICE`` slices: CPython
        runs a signal handler only on the main thread, and a SIGTERM the kernel gave another
        thread does not wake a wait with no timeout (the stop waited for the running receiver,
        120 s)."""
        with self.cond:
            while not self.cond.wait_for(done, timeout=SIGNAL_SLICE):
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
        start = 0
        next_summary = time.monotonic() + self.summary_interval if self.summary_interval else None
        if self.burst:
            self._settled(wait=0)  # from now on, streams receive in calls that end on their own
        self._check_paused()  # a worker started while a queue is paused never receives from it
        threading.Thread(target=self._watch_pauses, name="sq-pauses", daemon=True).start()
        while True:
            with self.cond:
                self._wait(lambda: self.stopping or self._wants_more())
                if self.stopping:
                    return
                idle_before = self.in_flight == 0
            if self.reseed_interval is not None and time.monotonic() >= self.next_seed:
                self._seed()
            if next_summary is not None and time.monotonic() >= next_summary:
                self.emit("summary", stats=self.stats.copy())
                next_summary = time.monotonic() + (self.summary_interval or 0)
            got = 0
            for offset in range(len(self.plans)):
                plan = self.plans[(start + offset) % len(self.plans)]
                if plan.label in self.paused:
                    continue
                health = self._health[plan.label]
                if health.failing and time.monotonic() < health.retry_at:
                    continue  # backing off: the other queues go on
                with self.cond:
                    free = self._free_slots()
                if free <= 0 or self.stopping:
                    break
                if plan.batch:
                    want = plan.batch_size
                elif self.depth == 1:
                    want = min(free, self.batch_size)
                else:
                    want = free
                if self.max_messages is not None:
                    want = min(want, self.max_messages - self.stats.received)
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
            start += 1
            if self.max_messages is not None and self.stats.received >= self.max_messages:
                return
            if got:
                continue
            failing = [h for h in self._health.values() if h.failing]
            if self.burst and not failing:
                bucket_wait = self.queue_limits.next_free()
                if bucket_wait is not None:  # a rate-limited queue waits for its bucket
                    self._idle_wait(min(bucket_wait, 0.2))
                    continue
                if idle_before:
                    # A whole round found nothing while nothing was in flight: stop once no
                    # row is leased to this process and unread, and each engine's last look
                    # found nothing due but what this worker gave back unmatched.
                    if self._settled():
                        self._burst_ended()
                        return
                    continue
                with self.cond:  # wait for in-flight work to finish, then look again
                    # (none in flight: all finished during this round's receive; look again
                    # at once, not after the timeout)
                    floor = max(self.in_flight, 1)

                    def finished(floor: int = floor) -> bool:
                        return self.stopping or self.in_flight < floor

                    self.cond.wait_for(finished, timeout=1.0)
                continue
            self.emit("idle")
            wait = self.poll_interval * random.uniform(0.5, 1.0)
            if failing and len(failing) == len(self.plans):  # nothing to ask before a retry
                wait = max(wait, min(h.retry_at for h in failing) - time.monotonic())
            bucket_wait = self.queue_limits.next_free()  # a rate-limited queue waits its bucket
            if bucket_wait is not None:  # ... no longer than until it has a start again
                wait = min(wait, bucket_wait)
            self._idle_wait(wait)
            recycle_connections()

    def _free_slots(self) -> int:
        return self.concurrency * self.depth - self.in_flight

    def _wants_more(self) -> bool:
        # depth 1: a free thread. Otherwise also fewer units waiting than threads, so that
        # a claim takes many messages at once rather than one each time one finishes.
        return self._free_slots() > 0 and self.waiting < self.concurrency

    def _idle_wait(self, seconds: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.stopping, timeout=seconds)

    def _receive(self, plan: Plan, want: int) -> int:
        """Receive up to ``want`` messages of ``plan``'s queue into slots (``_hold``) and onto
        ``units``; messages whose lease already expired are skipped. Returns how many came."""
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
        deliveries = [
            Delivery(message=m, model=plan.model, renew_at=renew_at(m, now)) for m in fresh
        ]
        units = [deliveries] if plan.batch else [[d] for d in deliveries]
        units = [u for u in units if u]
        self._hold(plan.label, units, received=len(messages))
        for unit in units:
            for d in unit:
                self.emit("received", message=d.message)
            self.units.put(unit)
        return len(messages)

    def _adapt(self, *, full: bool) -> None:
        """Adaptive prefetch: after a receive, ``depth`` becomes what one thread may hold,
        ``fit = min(AHEAD_SECONDS, lease / 2) / unit_seconds`` (at least 1, at most
        ``AUTO_PREFETCH_MAX``), so that what a thread holds starts well before its lease ends:
        doubling towards it after a receive that came back ``full`` (a backlog), at once down
        to it when receivers slow down. Nothing timed yet: one per free thread."""
        took = self.unit_seconds
        if took is None:
            return
        budget = (
            AHEAD_SECONDS
            if self.lease_seconds is None
            else min(AHEAD_SECONDS, self.lease_seconds / 2)
        )
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
                with self.cond:
                    if self.cond.wait_for(
                        lambda: self.stopping, timeout=controls.PAUSE_CHECK_SECONDS
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
        model = next(p.model for p in self.plans if p.label == health.label)
        forget_lost_connection(exc, self.cached(model)[0])
        now = time.monotonic()
        health.failures += 1
        health.error = exc
        if health.since is None:
            health.since = now
        # (the exponent is capped: a float times 2**1024 overflows, after ~75 min of failures)
        doubled = max(self.poll_interval, QUEUE_BACKOFF_MIN) * 2 ** min(health.failures, 64)
        health.retry_at = now + min(QUEUE_BACKOFF_MAX, doubled) * random.uniform(0.75, 1.0)
        self.count("receive_errors")
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
        self.emit("receive_failed", queue=health.label, error=exc)

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
        self.emit("queue_recovered", queue=health.label)

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

    # --- slots: the only writes of in_flight, waiting, by_queue, deliveries, unit_seconds ---
    def _hold(self, label: str, units: list[Unit], *, received: int) -> None:
        """Intake: the units of one receive of queue ``label`` (``received`` messages) are this
        worker's, each in a slot, waiting for an executor (the caller then puts them on
        ``units``); those beyond the threads free now wait ahead (given back if the worker
        stops first). Wakes the renewer."""
        with self.cond:
            self.stats.received += received
            for unit in units[max(0, self.concurrency - self.in_flight) :]:
                for d in unit:
                    d.ahead = True
            for unit in units:
                self.deliveries.update(unit)
                self.by_queue[label] += len(unit)
            self.in_flight += len(units)
            self.waiting += len(units)
            self.renew_cond.notify_all()

    def _take(self, unit: Unit) -> bool:
        """An executor took ``unit``: it no longer waits. Returns whether it is to be given
        back unstarted (the worker stops, and it was claimed ahead of a free thread, or every
        unit waits with a fixed prefetch > 1). Below the low-water mark the intake is woken."""
        prefetch = self.prefetch
        with self.cond:
            self.waiting -= 1
            fixed = prefetch is not None and prefetch > 1
            unstarted = self.stopping and (fixed or unit[0].ahead)
            ahead = prefetch is None or prefetch > 1  # units may wait for a thread
            if ahead and self.waiting == self.concurrency - 1:
                self.cond.notify_all()  # below the low-water mark: claim more
            return unstarted

    def _done(self, unit: Unit, took: float | None) -> None:
        """An executor is done with ``unit`` (``took`` seconds to run and ack; None: it did not
        run): its slot is free, its time goes into ``unit_seconds``."""
        with self.cond:
            for d in unit:
                d.done = True
            self.deliveries.difference_update(unit)
            self.by_queue[unit[0].model._meta.label] -= len(unit)
            self.in_flight -= 1
            if took is not None:  # for the adaptive prefetch
                avg = self.unit_seconds
                self.unit_seconds = took if avg is None else avg + (took - avg) * EWMA_WEIGHT
            # A slot is free: wake the intake only if it may claim now (it waits for fewer
            # waiting units than threads, or, with prefetch 1, for a free thread) and whoever
            # waits for the slots to empty or for a stop. With units still waiting nobody is
            # woken for nothing once per message.
            if self.waiting < self.concurrency or self.stopping:
                self.cond.notify_all()
            if self.stopping and self.in_flight == 0:
                self.renew_cond.notify_all()

    # --- the executor threads ---------------------------------------------------------------
    def _execute_units(self) -> None:
        """An executor thread: take units from ``units`` and run them until told to end
        (None)."""
        try:
            while True:
                unit = self.units.get()
                if unit is None:
                    return
                unstarted = self._take(unit)
                started = 0.0
                try:
                    plan = next(p for p in self.plans if p.model is unit[0].model)
                    if unstarted:
                        run_now = self.outcomes.return_unstarted(unit)
                        if run_now:
                            self._run_unit(plan, run_now)
                    else:
                        started = time.monotonic()
                        self._run_unit(plan, unit)
                except Exception:
                    logger.exception(
                        "worker error; message(s) left to lease expiry",
                        extra=self.log_extra("error", unit[0].message),
                    )
                except BaseException as exc:  # SystemExit, KeyboardInterrupt... from a receiver
                    self._crash(unit, exc)
                finally:
                    self._done(unit, time.monotonic() - started if started else None)
                    recycle_connections()
        finally:
            connections.close_all()

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
                extra=self.log_extra("crashed", d.message),
            )
            self.emit("crashed", message=d.message, error=exc)
        with self.cond:
            if self.crashed is None:
                self.crashed = exc
        self.stop()

    def _run_unit(self, plan: Plan, unit: Unit) -> None:
        """Run one unit: the deliveries whose lease is still held, not exhausted
        (``max_attempts``: given up on) and routed to a receiver (``NoReceiver``: given back,
        ``outcomes.unmatched``); a batch in groups per receiver of at most its batch size."""
        now = clock.now()
        mine, lost = [], []
        for d in unit:
            expires = d.message.lease_expires_at
            if d.lease_lost or (expires is not None and expires <= now):
                lost.append(d)  # lost by renewal, or expired waiting in the prefetch buffer
            else:
                mine.append(d)
        if lost:
            lost_before = LeaseLost("lease lost or expired before the receiver ran")
            self.outcomes.lease_lost(lost, lost_before)
        groups: dict[str, tuple[ReceiverSpec, list[Delivery]]] = {}
        unmatched: list[Delivery] = []
        miss: NoReceiver | None = None
        for d in mine:
            if DeliveryPolicy.exhausted(d.model, d.message):
                self.outcomes.give_up([d], None)
                continue
            try:
                spec = self.registry.route(plan.specs, d.message)
            except NoReceiver as exc:  # another release's receiver: give it back
                unmatched.append(d)
                miss = exc
                continue
            if plan.batch:
                groups.setdefault(spec.name, (spec, []))[1].append(d)
            else:
                self._execute(spec, [d])
        if miss is not None:
            self.outcomes.unmatched(unmatched, miss, plan.specs)
        for spec, group in groups.values():
            size = spec.max_batch_size or self.batch_size
            for i in range(0, len(group), size):
                self._execute(spec, group[i : i + size])

    def _execute(self, spec: ReceiverSpec, deliveries: list[Delivery]) -> None:
        """Run ``spec``'s receiver on ``deliveries`` and ack them, in its transaction when it is
        ``atomic``; what follows a failure, ``Retry`` or a lost lease is ``outcomes``'s."""
        model = deliveries[0].model
        db, engine, _ = self.cached(model)
        retries = engine.params.transaction_retries
        limit = spec.timeout if spec.timeout is not None else self.timeout  # (None: no limit)
        if spec.timeout_of is not None and len(deliveries) == 1:
            limit = spec.timeout_of(deliveries[0].message) or limit
        started = time.monotonic()
        for d in deliveries:
            self.emit("started", message=d.message, receiver=spec.name)

        by_key = {(d.message.queue, d.message.key): d for d in deliveries}

        def lease(message: Message) -> Message:
            """The lease held now (renewed), for the receiver's code (``context.lease``)."""
            with self.renew_lock:
                return by_key[(message.queue, message.key)].message

        def freeze(message: Message) -> Message:
            """The lease held now, for an ack by the receiver's code: no longer renewed."""
            return self.freeze([by_key[(message.queue, message.key)]])[0]

        context = MessageContext(
            spec,
            [d.message for d in deliveries],
            worker_id=self.worker_id,
            deadline=started + limit if limit is not None else None,
            lease=lease,
            freeze=freeze,
            stopping=lambda: self.stopping,
        )

        def body() -> None:
            with self.renew_lock:  # (again on a retried transaction: renew while it runs)
                for d in deliveries:
                    d.acking = False
            context._restart()  # (again on a retried transaction: its acks rolled back)
            with self.time_limits.running(deliveries, limit):
                try:
                    call(spec, context)
                except TimeLimitExceeded as exc:  # the interrupt: a bare class, say which run
                    if exc.args != (TimeLimitExceeded.INTERRUPTED,):
                        raise
                    error = time_limit_exceeded(spec.name, deliveries, limit)
                    raise error.with_traceback(exc.__traceback__) from None
            if any(d.timed_out for d in deliveries):  # returned late: never acked
                raise time_limit_exceeded(spec.name, deliveries, limit)
            if spec.atomic:
                self._ack(deliveries, db, context)

        try:
            with running(context):
                if spec.atomic:
                    run_in_transaction(body, using=db, retries=retries)
                else:
                    try:
                        body()  # outside any transaction: external side effects, then ack
                    except AckedFailure:
                        raise  # acked and failed, as the receiver says (the Tasks runner)
                    except Exception:
                        deliveries = self._not_acked_by_receiver(spec, deliveries, context)
                        if not deliveries:  # no message to fail: the error is only logged
                            logger.exception(
                                "%s raised after acking all its messages itself; the acks stand",
                                spec.name,
                                extra={"action": "error", "queue": model._meta.label},
                            )
                            return
                        raise  # the outcome below is the others'
                    run_in_transaction(
                        lambda: self._ack(deliveries, db, context), using=db, retries=retries
                    )
        except Retry as exc:
            self.outcomes.retry(deliveries, exc, spec, time.monotonic() - started)
        except TimeLimitExceeded as exc:
            if not any(d.stuck for d in deliveries):  # (a stuck run failed when given up on)
                self.outcomes.failed(deliveries, exc, spec, time.monotonic() - started)
            # the interrupt may have landed anywhere in the receiver's database code: start
            # this thread's next message on fresh connections
            connections.close_all()
        except LeaseLost as exc:
            self.outcomes.lease_lost(deliveries, exc, time.monotonic() - started)
        except MessageAlreadyAcked as exc:
            self.outcomes.already_acked(deliveries, exc, spec, time.monotonic() - started)
        except Exception as exc:
            duration = time.monotonic() - started
            if any(d.stuck for d in deliveries):
                pass  # its failure was counted when the worker gave up on it
            elif isinstance(exc, AckedFailure) and not spec.atomic:  # failure recorded, acked
                self.outcomes.failed(deliveries, exc.error, spec, duration, acked=True)
            else:
                self.outcomes.failed(deliveries, exc, spec, duration)
        else:
            duration = time.monotonic() - started
            self.count("processed", len(deliveries))
            debug = logger.isEnabledFor(logging.DEBUG)  # no log record built per message else
            for d in deliveries:
                if debug:
                    logger.debug(
                        "%s attempt %d acked (%s, %.3f s)",
                        d.message,
                        d.message.attempt,
                        spec.name,
                        duration,
                        extra=self.log_extra("acked", d.message, duration),
                    )
                self.emit("acked", message=d.message, receiver=spec.name, duration=duration)

    def _not_acked_by_receiver(
        self, spec: ReceiverSpec, deliveries: list[Delivery], context: MessageContext
    ) -> list[Delivery]:
        """A non-atomic receiver raised after acking some of its messages itself (those acks
        committed): they are done (processed, ``acked`` events); the rest are returned, for the
        outcome of the error. The Pub/Sub relay acks what Pub/Sub confirmed, then fails. An
        ack counts once it committed (``context.committed``): a time limit's interrupt inside
        the receiver's own transaction rolls its ack back, one after the commit finds the
        message done (it was counted failed, and "given back", though it no longer existed)."""
        done = [d for d in deliveries if context.committed(d.message)]
        if done:
            self.count("processed", len(done))
            for d in done:
                self.emit("acked", message=d.message, receiver=spec.name)
        return [d for d in deliveries if d not in done]

    def _ack(self, deliveries: list[Delivery], db: str, context: MessageContext) -> None:
        """Ack in the current transaction (``DeliveryPolicy.ack``), unless a lease was lost
        (then raise LeaseLost); the messages the receiver's code acked itself
        (``context.acked``) are done."""
        lost = [d for d in deliveries if d.lease_lost]
        if lost:
            raise LeaseLost(f"{lost[0].message}: lease lost while the receiver ran; not acked.")
        # the lease held now (renewed)
        pending = [m for m in self.freeze(deliveries) if not context.acked(m)]
        model = deliveries[0].model
        DeliveryPolicy(self.cached(model)[1]).ack(model, pending, using=db)

    # --- leases, as an ack, a retry, a release or the renewer reads them --------------------
    def freeze(self, deliveries: list[Delivery]) -> list[Message]:
        """The deliveries' messages with the lease held now; no renewal rotates their tokens
        from here on (``acking``)."""
        with self.renew_lock:
            for d in deliveries:
                d.acking = True
            return [d.message for d in deliveries]

    @contextlib.contextmanager
    def lease_write(
        self, model: type[Queue], write: Callable[[], T], *, wait: float | None = None
    ) -> Iterator[tuple[bool, T | None]]:
        """Run ``write()`` (a renewal, release or give-back of ``model``'s leases) holding
        ``renew_lock``, and keep holding it for the ``with`` block, which yields ``(True,
        write's result)`` and records the new leases: an ack reads no token in between. An
        ack takes ``renew_lock`` inside its transaction; ``transactions.holding`` orders this
        write the same way where the database has a single write lock. ``wait``: give up
        (``(False, None)``, nothing written) when this process's write lock stays busy that
        long (an atomic receiver of this process holds it while it runs). Errors of
        ``write()`` and of its transaction are raised by the ``with`` statement."""
        db, engine, _ = self.cached(model)
        retries = engine.params.transaction_retries
        with holding(self.renew_lock, write, using=db, retries=retries, wait=wait) as result:
            yield result

    def cached(self, model: type[Queue]) -> tuple[str, Any, QueueOptions]:
        """(database alias, engine, QueueOptions) of a queue, looked up once per worker."""
        cached = self._per_queue.get(model)
        if cached is None:
            cached = (api._database(model, None), engine_for(model), queue_options(model))
            self._per_queue[model] = cached
        return cached

    # --- events -----------------------------------------------------------------------------
    def emit(self, name: str, **info: Any) -> None:
        """Call the listeners with a ``WorkerEvent``; one that raises is logged. A burst
        worker remembers the messages given back unmatched (``unmatched_keys``)."""
        if name == "unmatched" and self.burst:
            self._note_unmatched(info["message"])
        if not self.listeners:
            return
        event = WorkerEvent(name=name, worker_id=self.worker_id, **info)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("worker event listener failed on %s", name)

    def _note_unmatched(self, message: Message) -> None:
        with self.cond:
            keys = self.unmatched_keys.get(message.queue)
            if keys is None or message.key in keys:
                return
            if self._unmatched_kept < BURST_UNMATCHED_KEPT:
                keys.add(message.key)
                self._unmatched_kept += 1

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name`` of ``stats``."""
        with self.cond:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def log_extra(
        self, action: str, message: Message, duration: float | None = None, **more: Any
    ) -> dict[str, Any]:
        """``events.log_extra`` with this worker's id."""
        return log_extra(action, message, worker_id=self.worker_id, duration=duration, **more)

    # --- signals ----------------------------------------------------------------------------
    def _on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT (``on_stop``): the first stops the worker, a second one (even before
        the first stop has run) ends the process (``abort``)."""
        name = signal.Signals(signum).name
        if not (self._signalled or self.stopping):
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
        self.emit("stopping")
        self.stop()


def plan_queues(
    queues: Sequence[str | type[Queue]] | None, registry: ReceiverRegistry, batch_size: int
) -> list[Plan]:
    """One ``Plan`` per queue to run (default: every queue that has receivers);
    ``QueueConfigurationError`` for an unknown queue or one without receivers."""
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
        plans.append(Plan(get_queue(label), specs, batch, size))
    return plans


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
