"""Limits: time limits of receivers (``TimeLimits``) and per-queue limits (``QueueLimits``).

Time limits: a receiver that runs past its limit (``@receiver(timeout=...)``, else the
worker's ``timeout``) is interrupted, its delivery counts as a failed attempt and its message
goes back to the queue; a receiver that cannot be interrupted stops the worker.

- At the limit the watchdog thread marks the delivery ``timed_out``: its lease is no longer
  renewed (so the message is delivered again even if nothing else happens), and
  ``TimeLimitExceeded`` is raised inside the receiver's thread (``PyThreadState_SetAsyncExc``:
  it lands between two Python bytecodes, so not while the thread waits in a C call). A receiver
  that returns after its limit (it caught the interrupt, or was in C) gets ``TimeLimitExceeded``
  from the worker instead of an ack, a failure like any other.
- The interrupt is raised only while the thread is inside the receiver's call: the thread leaves
  it under ``lock`` and clears any interrupt still pending, so none lands in the worker's code.
- ``STUCK_GRACE_SECONDS`` after the limit, a receiver still inside its call is stuck: the worker
  stops receiving, finishes its other messages and ``run()`` raises ``WorkerStuck``
  (``runqueueworker`` exits 3) so that a supervisor restarts the process.

Per-queue limits (``QueueMeta``): ``concurrency_limit`` caps the messages of a queue one worker
process holds (running or waiting); ``rate_limit`` caps the starts per second of a queue across
every worker: before a receive the worker takes starts from the queue's shared bucket
(``controls.take_starts``, one transaction per take) and receives no more than it got; starts it
took and did not use are credit for ``RATE_BURST_SECONDS``, then dropped (so the rate is never
exceeded, only under-used by an idle worker's credit).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from spanner_queues import clock, controls
from spanner_queues.exceptions import TimeLimitExceeded, WorkerStuck
from spanner_queues.worker.outcomes import Kind, Outcome

if TYPE_CHECKING:
    from spanner_queues.worker.events import Reporter
    from spanner_queues.worker.slots import Delivery, Plan, Slots

logger = logging.getLogger("spanner_queues.worker")

#: seconds a receiver may stay busy past its time limit before the worker gives up on it
STUCK_GRACE_SECONDS = 10.0
#: how often the watchdog looks when a limit is running (seconds)
TICK = 0.1
#: seconds the watchdog waits for the failure of a stuck run to be recorded (``give_up``)
STUCK_RECORD_SECONDS = 10.0


def time_limit_exceeded(
    receiver: str, deliveries: list[Delivery], limit: float | None
) -> TimeLimitExceeded:
    """The error of a run past its limit, naming the receiver, its message(s) and the limit
    (the interrupt itself is raised as the bare class: ``PyThreadState_SetAsyncExc``)."""
    first = deliveries[0].message
    what = f"{first} (attempt {first.attempt})"
    if len(deliveries) > 1:
        what = f"{len(deliveries)} messages of {first.queue}, the first {what}"
    limit_text = f"{limit:g} s" if limit is not None else "its limit"
    return TimeLimitExceeded(
        f"receiver {receiver} ran past its time limit of {limit_text} on {what}"
    )


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``thread_id`` at its next bytecode (None: cancel a pending one)."""
    target = ctypes.py_object(exc) if exc is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), target)


class TimeLimits:
    """The watchdog of receivers' time limits (see the module docstring)."""

    def __init__(
        self,
        slots: Slots,
        reporter: Reporter,
        *,
        settle: Callable[[list[Outcome]], object],
        grace: float = STUCK_GRACE_SECONDS,
    ) -> None:
        self.slots = slots
        self.reporter = reporter
        #: settles the failure of a stuck run (``Outcomes.settle``)
        self.settle = settle
        #: seconds a receiver may stay busy past its limit before the worker gives up on it
        self.grace = grace
        #: receiver threads by ident -> monotonic time their call started (for the logs)
        self.started: dict[int, float] = {}
        #: held while a thread enters or leaves a receiver's call and while one is interrupted
        self.lock = threading.Lock()
        #: receiver threads by ident -> their deliveries, while inside a call with a limit
        self.running_now: dict[int, list[Delivery]] = {}
        #: idents of the threads given up on (never joined)
        self.stuck_threads: set[int] = set()
        self.wake = threading.Event()

    @contextlib.contextmanager
    def running(self, deliveries: list[Delivery], limit: float | None) -> Iterator[None]:
        """Around the receiver's call: watch it against ``limit`` seconds from its first start
        (a retried transaction keeps the first deadline)."""
        if limit is None:
            yield
            return
        ident = threading.get_ident()
        with self.lock:
            deadline = time.monotonic() + limit
            for d in deliveries:
                if d.deadline is None:
                    d.deadline = deadline
            self.running_now[ident] = deliveries
            first = min(d.deadline for d in deliveries if d.deadline is not None)
            self.started[ident] = first - limit
        self.wake.set()
        try:
            yield
        finally:
            # Leave the call; an interrupt raised meanwhile may land in this very block (once):
            # catch it and finish leaving (the caller sees ``timed_out`` and fails the delivery).
            while True:
                try:
                    with self.lock:
                        self.running_now.pop(ident, None)
                        self.started.pop(ident, None)
                        if any(d.timed_out for d in deliveries):
                            _set_async_exc(ident, None)  # one not yet delivered lands nowhere
                    break
                except TimeLimitExceeded:
                    continue

    def run(self) -> None:
        """The watchdog thread: until the worker stops and holds nothing."""
        slots = self.slots
        while True:
            with slots.cond:
                if slots.drained:
                    return
            with self.lock:
                watched = list(self.running_now.items())
            if not watched:
                self.wake.wait(1.0)
                self.wake.clear()
                continue
            now = time.monotonic()
            for ident, deliveries in watched:
                if all(d.done for d in deliveries):
                    # finished: its thread left the call without clearing its entry (an
                    # interrupt can land in the context manager's own code before its cleanup)
                    with self.lock:
                        if self.running_now.get(ident) is deliveries:
                            del self.running_now[ident]
                    continue
                deadline = min(d.deadline for d in deliveries if d.deadline is not None)
                if now >= deadline and not any(d.timed_out for d in deliveries):
                    self.interrupt(ident, deliveries, now - deadline)
                elif now >= deadline + self.grace and not any(d.stuck for d in deliveries):
                    self.give_up(ident, deliveries)
            time.sleep(TICK)

    def interrupt(self, ident: int, deliveries: list[Delivery], late: float) -> None:
        with self.lock:
            if self.running_now.get(ident) is not deliveries:
                return  # left its call meanwhile
            for d in deliveries:
                d.timed_out = True  # no more renewals; no ack
            _set_async_exc(ident, TimeLimitExceeded)
        took = self.ran(deliveries)
        for d in deliveries:
            logger.warning(
                "%s attempt %d: the receiver ran past its time limit; interrupting it (the "
                "message goes back to the queue)",
                d.message,
                d.message.attempt,
                extra=self.reporter.log_extra(
                    "timed_out", d.message, took, late_seconds=round(late, 3)
                ),
            )
            self.reporter.emit("timed_out", message=d.message)
        self.reporter.count("timed_out", len(deliveries))

    def give_up(self, ident: int, deliveries: list[Delivery]) -> None:
        """A receiver did not leave its call within the grace after its limit: stop the worker
        and have ``run()`` raise ``WorkerStuck``."""
        self.stuck_threads.add(ident)
        self.slots.stuck(deliveries)
        for d in deliveries:
            logger.critical(
                "%s attempt %d: the receiver is still running %.0f s after its time limit and "
                "cannot be interrupted (blocked outside Python); stopping the worker so that "
                "its supervisor restarts it",
                d.message,
                d.message.attempt,
                self.grace,
                extra=self.reporter.log_extra("stuck", d.message, self.ran(deliveries)),
            )
        self.slots.stop()
        # The run counts as a failed attempt (recorded, with the message named in the error):
        # given back due after its back-off, or dead-lettered on its last attempt. Else the
        # message came back first on every restart and stopped each worker, for ever. (``run``
        # joins this thread before it raises WorkerStuck.) On a thread of its own, waited for
        # STUCK_RECORD_SECONDS at most: on a single-writer database (SQLite) a stuck atomic
        # receiver holds the process's write lock; the message then comes back after its lease.
        took = self.ran(deliveries)

        def record() -> None:
            for d in deliveries:
                error = WorkerStuck(
                    f"{d.message} attempt {d.message.attempt}: the receiver was still running "
                    f"{self.grace:g} s after its time limit and could not be interrupted; the "
                    "worker stopped"
                )
                self.settle([Outcome(Kind.STUCK, d, None, took, error)])

        recorder = threading.Thread(target=record, name="sq-stuck-failure", daemon=True)
        recorder.start()
        recorder.join(STUCK_RECORD_SECONDS)
        if recorder.is_alive():
            logger.error(
                "the failure of the stuck run of %s was not recorded within %g s (its receiver "
                "holds the database's write lock?); it comes back after its lease",
                ", ".join(str(d.message) for d in deliveries),
                STUCK_RECORD_SECONDS,
            )

    def ran(self, deliveries: list[Delivery]) -> float | None:
        """Seconds since the receiver call of ``deliveries`` started (None: it left it)."""
        with self.lock:
            started = next(
                (self.started.get(i) for i, ds in self.running_now.items() if ds is deliveries),
                None,
            )
        return None if started is None else time.monotonic() - started


class QueueLimits:
    """A worker's per-queue limits (see the module docstring); used by the intake thread only."""

    def __init__(self, plans: Sequence[Plan], slots: Slots) -> None:
        self.slots = slots
        options = {p.label: p.options for p in plans}
        #: label -> concurrency_limit, for the queues that have one
        self.concurrency = {
            label: o.concurrency_limit for label, o in options.items() if o.concurrency_limit
        }
        #: label -> rate_limit, for the queues that have one
        self.rates = {label: float(o.rate_limit) for label, o in options.items() if o.rate_limit}
        #: label -> (starts taken and not used, monotonic time they lapse)
        self.credit: dict[str, tuple[int, float]] = {}
        #: label -> monotonic time before which the shared bucket has no start to give
        self.empty_until: dict[str, float] = {}

    def admit(self, plan: Plan, want: int) -> int:
        """How many of ``plan``'s messages the worker may receive now (at most ``want``)."""
        label = plan.label
        limit = self.concurrency.get(label)
        if limit is not None:
            want = min(want, limit - self.slots.held(label))
        rate = self.rates.get(label)
        if want <= 0 or rate is None:
            return max(want, 0)
        now = time.monotonic()
        credit, lapses = self.credit.get(label, (0, 0.0))
        if lapses <= now:
            credit = 0
        if credit < want and self.empty_until.get(label, 0.0) <= now:
            granted, free_at = controls.take_starts(plan.model, want - credit, rate)
            if granted:
                # new starts lapse with the ones still held (never later): each start is used
                # within RATE_BURST_SECONDS of being taken, or not at all
                if credit == 0:
                    lapses = now + controls.RATE_BURST_SECONDS
                credit += granted
            if credit < want:
                wait = (free_at - clock.now()).total_seconds()
                self.empty_until[label] = now + max(wait, 0.0)
            else:
                self.empty_until.pop(label, None)
        self.credit[label] = (credit, lapses)
        return min(want, credit)

    def received(self, plan: Plan, count: int) -> None:
        """``count`` messages of ``plan`` were received: they use that much credit."""
        if plan.label in self.rates:
            credit, lapses = self.credit.get(plan.label, (0, 0.0))
            self.credit[plan.label] = (max(credit - count, 0), lapses)

    def next_free(self) -> float | None:
        """Seconds until a rate-limited queue that wanted more starts than it got may have one
        again, 0 when it may now (None: none is waiting). (A queue whose wait had passed once
        read as not waiting: the worker then slept its poll interval, and 20 starts/s came at
        11.5/s with ``--poll-interval 2``.)"""
        now = time.monotonic()
        waits = [max(t - now, 0.0) for t in self.empty_until.values()]
        return min(waits) if waits else None
