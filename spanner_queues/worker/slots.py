"""What the worker holds: ``Plan`` (one queue it runs, with its database, engine, options and
delivery policy), ``Delivery`` (a message it holds, with its current lease) and ``Slots`` (its
slot accounting, which changes in ``Slots``'s own methods only).

Locking: ``Slots.cond`` (and ``renew_cond``, on the same lock) guard the fields of ``Slots``
and ``stopping``. ``in_flight``, ``waiting``, ``by_queue``, ``deliveries``, ``unit_seconds`` and
``stuck_units`` change in four methods only: ``hold`` (the intake's claim), ``take`` and
``done`` (an executor's), ``stuck`` (the watchdog's).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from spanner_queues import clock
from spanner_queues.message import Message
from spanner_queues.receivers import MessageContext, ReceiverSpec

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine
    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions
    from spanner_queues.worker.apply import DeliveryPolicy

#: seconds a wait of the main thread lasts at most before it looks again (signal handlers run)
SIGNAL_SLICE = 0.2
#: weight of the latest unit in the moving average of unit durations (``unit_seconds``)
EWMA_WEIGHT = 0.2


@dataclass(frozen=True, slots=True)
class Plan:
    """One queue this worker runs: its receivers, how many messages make a unit, and, looked
    up once, its database alias, engine, ``QueueOptions`` and delivery policy."""

    model: type[Queue]
    specs: tuple[ReceiverSpec, ...]
    batch: bool
    batch_size: int
    db: str
    engine: BaseQueueEngine
    options: QueueOptions
    policy: DeliveryPolicy
    #: time limit in seconds of its receivers that set none (the worker's; None: no limit)
    timeout: float | None = None
    label: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", self.model._meta.label)

    def time_limit(self, spec: ReceiverSpec, messages: Sequence[Message]) -> float | None:
        """Seconds ``spec``'s receiver may run on ``messages`` (None: no limit): its
        ``timeout_of(message)`` for one message, else its ``timeout``, else the worker's. The
        one lookup (the run's interrupt, the health check)."""
        limit = spec.timeout if spec.timeout is not None else self.timeout
        if spec.timeout_of is not None and len(messages) == 1:
            limit = spec.timeout_of(messages[0]) or limit
        return limit

    @property
    def retries(self) -> int:
        """How often a transaction on this queue's database is retried (the engine's)."""
        return self.engine.params.transaction_retries


@dataclass(eq=False, slots=True)
class Delivery:
    """A message this worker holds, with its current (possibly renewed) lease."""

    message: Message
    plan: Plan
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
    #: when this worker received it (a cancel that deleted a message applies to a delivery
    #: received before it, not to one of a message sent again later under its key)
    received_at: datetime = field(default_factory=clock.now)
    #: the run of its receiver (set when it starts; ``active`` while it runs): the renewer
    #: tells it of a cancellation (``MessageContext.cancelled``)
    context: MessageContext | None = None

    @property
    def model(self) -> type[Queue]:
        return self.plan.model

    @property
    def renewable(self) -> bool:
        """Still this worker's to renew: not done, lease not lost, no ack reading its token,
        not past its time limit."""
        return not (self.done or self.lease_lost or self.acking or self.timed_out)


#: a unit: one message, or the messages of one batch
Unit = list[Delivery]


class Slots:
    """The worker's slot accounting (see the module docstring): ``concurrency`` threads, each
    holding up to ``depth`` units."""

    def __init__(self, concurrency: int, prefetch: int | None) -> None:
        self.concurrency = concurrency
        #: units each thread may hold (None: adaptive)
        self.prefetch = prefetch
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        #: the renewer's own wake-ups (new deliveries, stop), not one per finished message
        self.renew_cond = threading.Condition(lock)
        self.stopping = False
        self.in_flight = 0  # units (slots) taken, running or waiting
        #: the intake claims again while fewer units wait than this (and a slot is free):
        #: one a thread, or more for batch receivers (``intake.BATCH_UNITS_AHEAD``)
        self.low_water = concurrency
        self.waiting = 0  # units received and not yet taken by an executor
        #: moving average of the seconds one unit takes to run and ack (None: none ran yet)
        self.unit_seconds: float | None = None
        self.deliveries: set[Delivery] = set()  # held: running or waiting
        #: messages held (running or waiting) by queue label, for ``QueueMeta.concurrency_limit``
        self.by_queue: Counter[str] = Counter()
        #: units whose receiver could not be interrupted past its time limit (``limits``):
        #: the worker stops without waiting for them
        self.stuck_units = 0

    def stop(self) -> None:
        """From now on ``stopping``; wakes every waiter."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            self.renew_cond.notify_all()

    def wait_until(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()`` (checked under ``cond``), in ``SIGNAL_SLICE`` slices: CPython
        runs a signal handler only on the main thread, and a SIGTERM the kernel gave another
        thread does not wake a wait with no timeout (the stop waited for the running receiver,
        120 s)."""
        with self.cond:
            while not self.cond.wait_for(done, timeout=SIGNAL_SLICE):
                pass

    @property
    def drained(self) -> bool:
        """Stopping, and holding nothing but the units of stuck receivers (read under
        ``cond``): the renewer, the watchdog and ``run()`` end."""
        return self.stopping and self.in_flight <= self.stuck_units

    def free(self, depth: int) -> int:
        """Slots free at ``depth`` units per thread."""
        return self.concurrency * depth - self.in_flight

    def held(self, label: str) -> int:
        """Messages of queue ``label`` held now (running or waiting)."""
        with self.cond:
            return self.by_queue[label]

    def renewable(self) -> list[Delivery]:
        """The deliveries held whose leases are still this worker's to renew (under ``cond``)."""
        with self.cond:
            return [d for d in self.deliveries if d.renewable]

    def hold(self, label: str, units: list[Unit]) -> None:
        """Intake: the units of one receive of queue ``label`` are this worker's, each in a
        slot, waiting for an executor; those beyond the threads free now wait ahead (given back
        if the worker stops first). Wakes the renewer."""
        with self.cond:
            for unit in units[max(0, self.concurrency - self.in_flight) :]:
                for d in unit:
                    d.ahead = True
            for unit in units:
                self.deliveries.update(unit)
                self.by_queue[label] += len(unit)
            self.in_flight += len(units)
            self.waiting += len(units)
            self.renew_cond.notify_all()

    def take(self, unit: Unit) -> bool:
        """An executor took ``unit``: it no longer waits. Returns whether it is to be given
        back unstarted (stopping, and it was claimed ahead of a free thread, or every unit
        waits with a fixed prefetch > 1). Below the low-water mark the intake is woken."""
        prefetch = self.prefetch
        with self.cond:
            self.waiting -= 1
            fixed = prefetch is not None and prefetch > 1
            unstarted = self.stopping and (fixed or unit[0].ahead)
            ahead = prefetch is None or prefetch > 1  # units may wait for a thread
            if ahead and self.waiting == self.low_water - 1:
                self.cond.notify_all()  # below the low-water mark: claim more
            return unstarted

    def done(self, unit: Unit, took: float | None) -> None:
        """An executor is done with ``unit`` (``took`` seconds to run and ack; None: it did not
        run): its slot is free, its time goes into ``unit_seconds``."""
        with self.cond:
            for d in unit:
                d.done = True
            self.deliveries.difference_update(unit)
            self.by_queue[unit[0].plan.label] -= len(unit)
            self.in_flight -= 1
            if took is not None:  # for the adaptive prefetch
                avg = self.unit_seconds
                self.unit_seconds = took if avg is None else avg + (took - avg) * EWMA_WEIGHT
            # A slot is free: wake the intake only if it may claim now (it waits for fewer
            # waiting units than threads, or, with prefetch 1, for a free thread) and whoever
            # waits for the slots to empty or for a stop. With units still waiting nobody is
            # woken for nothing once per message.
            if self.waiting < self.low_water or self.stopping:
                self.cond.notify_all()
            if self.stopping and self.in_flight == 0:
                self.renew_cond.notify_all()

    def stuck(self, unit: Unit) -> None:
        """The watchdog gave up on ``unit``'s receiver: the worker stops without waiting for
        it."""
        with self.cond:
            for d in unit:
                d.stuck = True
            self.stuck_units += 1
