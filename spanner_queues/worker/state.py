"""What a worker holds, shared by its parts: the deliveries (received messages with their
current lease), the units waiting for an executor, the slot counters, and the locks; and how
it runs (``Config``, read by its parts).

Locking: ``cond`` (and ``renew_cond``, on the same lock) guard the counters, ``deliveries``
and ``stopping``. The slot accounting (``in_flight``, ``waiting``, ``by_queue``,
``deliveries``, ``unit_seconds``) changes only in ``Holdings``'s own methods, in one place:
``hold`` (the intake's claim), ``take`` and ``done`` (an executor's). ``renew_lock`` is held by
a renewal, and by whoever reads a delivery's lease token to ack, retry, release or dead-letter
it (``freeze``), so the token acked with is the row's until the ack commits.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, TypeVar

from spanner_queues import api
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.registry import engine_for
from spanner_queues.transactions import holding

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine
    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions
    from spanner_queues.receivers import ReceiverRegistry, ReceiverSpec

T = TypeVar("T")

#: weight of the latest unit in the moving average of unit durations (``unit_seconds``)
EWMA_WEIGHT = 0.2


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """How a worker runs: the ``Worker``'s arguments, validated by it, read by its parts
    (``intake``, ``execution``); see ``Worker`` for each."""

    plans: tuple[Plan, ...]
    registry: ReceiverRegistry
    concurrency: int
    #: units each thread may hold (None: adaptive)
    prefetch: int | None
    batch_size: int
    burst: bool
    max_messages: int | None
    lease: timedelta | None
    poll_interval: float
    #: seconds between re-seeds of the periodic schedules while running (None: at start only)
    reseed_interval: float | None
    summary_interval: float | None


#: a unit: one message, or the messages of one batch; None tells an executor to end
Unit = list[Delivery]


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


class Holdings:
    """The worker's shared state (see the module docstring for its locking)."""

    def __init__(self) -> None:
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        # the renewer's own wake-ups (new deliveries, stop), not one per finished message
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
        #: monotonic time of the next re-seed of periodic schedules (0: at the next round)
        self.next_seed = 0.0
        #: the first BaseException (not an Exception) a receiver raised; run() re-raises it
        self.crashed: BaseException | None = None
        #: units whose receiver could not be interrupted past its time limit (``limits``):
        #: the worker stops without waiting for them
        self.stuck_units = 0
        self._per_queue: dict[type[Queue], tuple[str, BaseQueueEngine, QueueOptions]] = {}

    def hold(self, label: str, units: list[Unit], *, concurrency: int) -> None:
        """Intake: the units of one receive of queue ``label`` are this worker's, each in a
        slot, waiting for an executor (the caller then puts them on ``units``); those beyond
        the threads free now wait ahead (given back if the worker stops first). Wakes the
        renewer."""
        with self.cond:
            for unit in units[max(0, concurrency - self.in_flight) :]:
                for d in unit:
                    d.ahead = True
            for unit in units:
                self.deliveries.update(unit)
                self.by_queue[label] += len(unit)
            self.in_flight += len(units)
            self.waiting += len(units)
            self.renew_cond.notify_all()

    def take(self, unit: Unit, *, concurrency: int, ahead: bool, fixed_prefetch: bool) -> bool:
        """An executor took ``unit``: it no longer waits. Returns whether it is to be given
        back unstarted (the worker stops, and it was claimed ahead of a free thread, or every
        unit waits with a fixed prefetch). Below the low-water mark the intake is woken."""
        with self.cond:
            self.waiting -= 1
            unstarted = self.stopping and (fixed_prefetch or unit[0].ahead)
            if ahead and self.waiting == concurrency - 1:
                self.cond.notify_all()  # below the low-water mark: claim more
            return unstarted

    def done(self, unit: Unit, took: float | None, *, concurrency: int) -> None:
        """An executor is done with ``unit`` (``took`` seconds to run and ack; None: it did not
        run): its slot is free, its time goes into ``unit_seconds``."""
        with self.cond:
            for d in unit:
                d.done = True
            self.deliveries.difference_update(unit)
            self.by_queue[unit[0].model._meta.label] -= len(unit)
            self.in_flight -= 1
            if took is not None:  # for the adaptive prefetch (intake)
                avg = self.unit_seconds
                self.unit_seconds = took if avg is None else avg + (took - avg) * EWMA_WEIGHT
            # A slot is free: wake the intake only if it may claim now (it waits for fewer
            # waiting units than threads, or, with prefetch 1, for a free thread) and whoever
            # waits for the slots to empty or for a stop. With units still waiting nobody is
            # woken for nothing once per message.
            if self.waiting < concurrency or self.stopping:
                self.cond.notify_all()
            if self.stopping and self.in_flight == 0:
                self.renew_cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            self.renew_cond.notify_all()

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


def renew_at(message: Message, now: datetime) -> datetime | None:
    """Halfway through the remaining lease (Spanner extends by 10 s: renew every ~5 s)."""
    if message.lease_expires_at is None:
        return None
    return now + (message.lease_expires_at - now) / 2
