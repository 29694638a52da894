"""Intake: what the worker receives and when. The loop claims at most the free slots
(``concurrency`` threads, each holding up to ``depth`` units; a batch queue fills one slot
with up to ``batch_size`` messages); with ``depth > 1`` it claims again only when fewer than
``concurrency`` units are left waiting. Received messages whose lease already expired are
skipped. Between rounds it re-seeds the periodic schedules and emits summaries. A queue whose
receive raises fails alone (``QueueHealth``): it is skipped until its back-off has passed
(``QUEUE_BACKOFF_*``), the other queues are asked as usual, and its first receive that succeeds
ends the episode (``receive_failed`` / ``queue_recovered`` events, one log line each way).

``depth`` is ``prefetch`` when given. Adaptive (``prefetch=None``, the default) it starts at 1
and is recomputed after each receive from the moving average ``d`` of a unit's run time: it
may hold ``fit = min(AHEAD_SECONDS, lease / 2) / d`` units per thread (at least 1, at most
``AUTO_PREFETCH_MAX``), so what a thread holds can be started well before its lease ends. It
doubles (up to ``fit``) only after a receive that came back full (a backlog) once a unit has
been timed, and drops to ``fit`` at once when receivers slow down: slow receivers (``d``
above ``AHEAD_SECONDS / 2``) take one message per free thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import connections

from spanner_queues import api, clock, controls
from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.registry import get_queue
from spanner_queues.transactions import forget_lost_connection
from spanner_queues.worker.events import Emitter
from spanner_queues.worker.execution import recycle_connections
from spanner_queues.worker.limits import QueueLimits
from spanner_queues.worker.state import Config, Delivery, Holdings, Plan, QueueHealth, renew_at

if TYPE_CHECKING:
    from spanner_queues.models import Queue

logger = logging.getLogger("spanner_queues.worker")

#: seconds a wait of the main thread lasts at most before it looks again (signal handlers run)
SIGNAL_SLICE = 0.2

#: adaptive prefetch: most seconds of work one thread holds waiting (at the measured average)
AHEAD_SECONDS = 0.25
#: adaptive prefetch: most units one thread holds
AUTO_PREFETCH_MAX = 100
#: a failing queue is asked again after max(poll_interval, MIN) x 2^failures seconds, at
#: most MAX (jittered down by a quarter)
QUEUE_BACKOFF_MIN = 0.1
QUEUE_BACKOFF_MAX = 5.0


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


class Intake:
    """Receives for the worker's plans into ``held.units`` (see the module docstring)."""

    def __init__(self, held: Holdings, events: Emitter, config: Config) -> None:
        self.held = held
        self.events = events
        self.config = config
        #: units each thread may hold now (see the module docstring)
        self.depth = 1 if config.prefetch is None else config.prefetch
        #: the lease the last receive got, in seconds (None: the engine gives none)
        self.lease_seconds: float | None = None
        #: labels of this worker's queues paused by an operator (``controls``): read before the
        #: first round, then every ``PAUSE_CHECK_SECONDS`` by the ``watch_pauses`` thread (a
        #: read that waits out a database outage never holds up this loop or a stop)
        self.paused: frozenset[str] = frozenset()
        #: ``QueueMeta.concurrency_limit`` and ``rate_limit`` of the plans
        self.limits = QueueLimits(held, config.plans)
        #: receive failures per queue (label): each queue fails, backs off and recovers alone
        self.health: dict[str, QueueHealth] = {p.label: QueueHealth(p.label) for p in config.plans}

    @property
    def queue_labels(self) -> list[str]:
        return [p.label for p in self.config.plans]

    def seed(self) -> None:
        """Send the first run of every ``periodic`` schedule of this worker's queues whose
        message is missing (at start, every ``reseed_interval`` and after a message was
        dead-lettered or discarded): a schedule whose message was dead-lettered, discarded
        or deleted starts again without a restart."""
        from spanner_queues.patterns import seed_schedules

        if self.config.reseed_interval is not None:
            self.held.next_seed = time.monotonic() + self.config.reseed_interval
        try:
            for message in seed_schedules(self.queue_labels, registry=self.config.registry):
                logger.info("seeded periodic schedule %s", message, extra={"action": "seeded"})
        except Exception:
            logger.exception("seeding periodic schedules failed", extra={"action": "error"})

    def free_slots(self) -> int:
        return self.config.concurrency * self.depth - self.held.in_flight

    def wants_more(self) -> bool:
        # depth 1: a free thread. Otherwise also fewer units waiting than threads, so that
        # a claim takes many messages at once rather than one each time one finishes.
        return self.free_slots() > 0 and self.held.waiting < self.config.concurrency

    def loop(self) -> None:
        """Claim while there are free slots, until stopped (or, with ``burst``, until a whole
        round finds nothing due while nothing is held, no queue is failing and every engine
        says no row is leased to this process and unread, ``api.settle_receiving``; or after
        ``max_messages``). A queue whose receive raises fails alone (``queue_failed``): it
        backs off, the others go on."""
        start = 0
        interval = self.config.summary_interval
        next_summary = time.monotonic() + interval if interval else None
        if self.config.burst:
            self.settled(wait=0)  # from now on, streams receive in calls that end on their own
        self.check_paused()  # a worker started while a queue is paused never receives from it
        threading.Thread(target=self.watch_pauses, name="sq-pauses", daemon=True).start()
        while True:
            with self.held.cond:
                # (in slices: CPython runs a signal handler only on the main thread, and a
                # SIGTERM the kernel gave another thread does not wake a wait with no timeout:
                # the stop waited for the running receiver, 120 s)
                while not self.held.cond.wait_for(
                    lambda: self.held.stopping or self.wants_more(), timeout=SIGNAL_SLICE
                ):
                    pass
                if self.held.stopping:
                    return
                idle_before = self.held.in_flight == 0
            if self.config.reseed_interval is not None and time.monotonic() >= self.held.next_seed:
                self.seed()
            if next_summary is not None and time.monotonic() >= next_summary:
                self.events.emit("summary", stats=self.events.stats.copy())
                next_summary = time.monotonic() + (self.config.summary_interval or 0)
            got = 0
            for offset in range(len(self.config.plans)):
                plan = self.config.plans[(start + offset) % len(self.config.plans)]
                if plan.label in self.paused:
                    continue
                health = self.health[plan.label]
                if health.failing and time.monotonic() < health.retry_at:
                    continue  # backing off: the other queues go on
                with self.held.cond:
                    free = self.free_slots()
                if free <= 0 or self.held.stopping:
                    break
                if plan.batch:
                    want = plan.batch_size
                elif self.depth == 1:
                    want = min(free, self.config.batch_size)
                else:
                    want = free
                if self.config.max_messages is not None:
                    want = min(want, self.config.max_messages - self.events.stats.received)
                if want <= 0:
                    break
                try:
                    want = self.limits.admit(plan, want)
                    if want <= 0:
                        continue  # this queue is at its limit: the others may go on
                    n = self.receive(plan, want)
                except Exception as exc:
                    self.queue_failed(health, exc)
                    continue
                self.limits.received(plan, n)
                if health.failing:
                    self.queue_recovered(health)
                got += n
                if self.config.prefetch is None:
                    self.adapt(full=n >= want)
            start += 1
            received = self.events.stats.received
            if self.config.max_messages is not None and received >= self.config.max_messages:
                return
            if got:
                continue
            failing = [h for h in self.health.values() if h.failing]
            if self.config.burst and not failing:
                bucket_wait = self.limits.next_free()
                if bucket_wait is not None:  # a rate-limited queue waits for its bucket
                    self.idle_wait(min(bucket_wait, 0.2))
                    continue
                if idle_before:
                    # A whole round found nothing due while nothing was in flight: stop once
                    # no row is leased to this process and unread (else receive it).
                    if self.settled():
                        return
                    continue
                with self.held.cond:  # wait for in-flight work to finish, then look again
                    # (none in flight: all finished during this round's receive; look again
                    # at once, not after the timeout)
                    floor = max(self.held.in_flight, 1)

                    def finished(floor: int = floor) -> bool:
                        return self.held.stopping or self.held.in_flight < floor

                    self.held.cond.wait_for(finished, timeout=1.0)
                continue
            self.events.emit("idle")
            wait = self.config.poll_interval * random.uniform(0.5, 1.0)
            if failing and len(failing) == len(self.config.plans):  # nothing to ask before a retry
                wait = max(wait, min(h.retry_at for h in failing) - time.monotonic())
            bucket_wait = self.limits.next_free()  # a rate-limited queue waits for its bucket
            if bucket_wait is not None:
                wait = max(wait, min(bucket_wait, 0.2))
            self.idle_wait(wait)
            recycle_connections()

    def watch_pauses(self) -> None:
        """The pause watcher thread: ``check_paused`` every ``PAUSE_CHECK_SECONDS`` until the
        worker stops."""
        try:
            while True:
                with self.held.cond:
                    if self.held.cond.wait_for(
                        lambda: self.held.stopping, timeout=controls.PAUSE_CHECK_SECONDS
                    ):
                        return
                self.check_paused()
        finally:
            connections.close_all()

    def check_paused(self) -> None:
        """Read which of this worker's queues are paused; stop the background receiving of a
        queue once it is paused, so rows it leased and nobody started go back. A failed read
        keeps the last answer."""
        try:
            now_paused = set(controls.paused(p.model for p in self.config.plans))
        except Exception:
            logger.exception("reading paused queues failed", extra={"action": "error"})
            return
        for plan in self.config.plans:
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

    def queue_failed(self, health: QueueHealth, exc: Exception) -> None:
        """A receive of ``health``'s queue raised: back it off alone (``QUEUE_BACKOFF_*``,
        doubling per failure in a row). Logged once per episode (a warning with the
        traceback); later failures of the episode at debug level. A lost database connection
        is closed, so the next receive reconnects."""
        forget_lost_connection(exc, self.held.cached(self.plan_of(health.label).model)[0])
        now = time.monotonic()
        health.failures += 1
        health.error = exc
        if health.since is None:
            health.since = now
        # (the exponent is capped: a float times 2**1024 overflows, after ~75 min of failures)
        doubled = max(self.config.poll_interval, QUEUE_BACKOFF_MIN) * 2 ** min(health.failures, 64)
        delay = min(QUEUE_BACKOFF_MAX, doubled)
        health.retry_at = now + delay * random.uniform(0.75, 1.0)
        with self.held.cond:
            self.events.stats.receive_errors += 1
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
        self.events.emit("receive_failed", queue=health.label, error=exc)

    def queue_recovered(self, health: QueueHealth) -> None:
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
        self.events.emit("queue_recovered", queue=health.label)

    def plan_of(self, label: str) -> Plan:
        return next(p for p in self.config.plans if p.label == label)

    def settled(self, wait: float | None = None) -> bool:
        """No queue of this worker has rows leased to this process and unread
        (``api.settle_receiving``; every queue is asked, so their open calls end together).
        A queue whose settle raises is failing (``queue_failed``): not settled."""
        answers = []
        for plan in self.config.plans:
            try:
                answers.append(api.settle_receiving(plan.model, wait=wait))
            except Exception as exc:
                self.queue_failed(self.health[plan.label], exc)
                answers.append(False)
        return all(answers)

    def adapt(self, *, full: bool) -> None:
        """Adaptive prefetch: recompute ``depth`` after a receive (module docstring)."""
        took = self.held.unit_seconds
        if took is None:
            return  # nothing timed yet: one per free thread
        budget = (
            AHEAD_SECONDS
            if self.lease_seconds is None
            else min(AHEAD_SECONDS, self.lease_seconds / 2)
        )
        if took > 0:
            fit = max(1, min(AUTO_PREFETCH_MAX, int(budget / took)))
        else:  # too quick for the clock
            fit = AUTO_PREFETCH_MAX if budget > 0 else 1
        depth = min(self.depth * 2, fit) if full else min(self.depth, fit)
        self.depth = depth

    def idle_wait(self, seconds: float) -> None:
        with self.held.cond:
            self.held.cond.wait_for(lambda: self.held.stopping, timeout=seconds)

    def receive(self, plan: Plan, want: int) -> int:
        # Serving several queues, a receive takes what a queue's stream holds now: waiting on
        # one queue's stream (native queues) held up every other, and a round over N idle
        # queues took N waits (30 queues: 15 s before a task was run). The streams go on
        # receiving in the background; the next round, ``poll_interval`` later, takes it.
        wait = 0.0 if len(self.config.plans) > 1 else None
        messages = api.receive(plan.model, max_messages=want, lease=self.config.lease, wait=wait)
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
                extra={
                    "action": "lease_expired",
                    "queue": plan.label,
                    "worker_id": self.events.worker_id,
                },
            )
        deliveries = [
            Delivery(message=m, model=plan.model, renew_at=renew_at(m, now)) for m in fresh
        ]
        units = [deliveries] if plan.batch else [[d] for d in deliveries]
        units = [u for u in units if u]
        with self.held.cond:
            self.events.stats.received += len(messages)
            self.held.hold(plan.label, units, concurrency=self.config.concurrency)
        for unit in units:
            for d in unit:
                self.events.emit("received", message=d.message)
            self.held.units.put(unit)
        return len(messages)
