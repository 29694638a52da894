"""The intake: the worker's thread that receives (the thread that called ``Worker.run``).

Round after round over the worker's queues it receives into free slots (``Slots.hold``) and
puts each unit on the executors' queue; it adapts the prefetch, backs a failing queue off alone
(``QueueHealth``), skips paused queues and queues at their limit, re-seeds periodic schedules,
emits the summary, and decides when a burst is over. It holds narrow handles (the plans, the
``Slots``, the ``Reporter``, the ``QueueLimits``, the ``Groups``), never the ``Worker``, and
calls each plan's engine directly (the ``Plan`` looked it up once).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from queue import SimpleQueue
from typing import Any

from django.db import connections

from spanner_queues import api, clock, controls, ordering, uniqueness
from spanner_queues.message import Message
from spanner_queues.patterns import seed_schedules
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.transactions import (
    forget_lost_connection,
    recycle_connections,
    run_in_transaction,
)
from spanner_queues.worker.events import Reporter
from spanner_queues.worker.group import Groups
from spanner_queues.worker.leases import renew_at
from spanner_queues.worker.limits import QueueLimits
from spanner_queues.worker.slots import Delivery, Plan, Slots, Unit

#: at most this many waiting messages of ordered queues are remembered (their wait grows)
WAITS_REMEMBERED = 10_000

logger = logging.getLogger("spanner_queues.worker")

#: adaptive prefetch: most seconds of work one thread holds waiting (at the measured average)
AHEAD_SECONDS = 0.25
#: adaptive prefetch: most units one thread holds (where its groups hold more, two groups'
#: worth: one fills while the next is claimed, so a group closes full, not at the end of what
#: one claim brought; on SQLite's groups of 100 that halved the claims and commits of a drain)
AUTO_PREFETCH_MAX = 100
#: units of batch receivers (one claim each) that may wait per thread, claimed ahead, before
#: the intake stops claiming (other units: one): a batch's claim can take as long as a batch's
#: run (on SQLite it waits for the write lock behind an ack), and with one waiting the thread
#: waited for it. Before a unit was timed the adaptive prefetch holds two a thread (one
#: running, one waiting; other units: one)
BATCH_UNITS_AHEAD = 2
#: a failing queue is asked again after max(poll_interval, MIN) x 2^failures seconds, at
#: most MAX (jittered down by a quarter)
QUEUE_BACKOFF_MIN = 0.1
QUEUE_BACKOFF_MAX = 5.0
#: burst: a queue failing every receive for this long, with nothing else left to do, ends the
#: burst with ``BurstFailed`` (a long run waits for the queue to recover, as it should)
BURST_GIVE_UP_SECONDS = 60.0
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


class Intake:
    """The worker's receiving side (see the module). Built by ``Worker``; ``run`` is called
    on the thread that called ``Worker.run``."""

    def __init__(
        self,
        plans: Sequence[Plan],
        *,
        slots: Slots,
        units: SimpleQueue[Unit | None],
        reporter: Reporter,
        queue_limits: QueueLimits,
        groups: Groups,
        registry: ReceiverRegistry,
        worker_id: str,
        concurrency: int,
        prefetch: int | None,
        batch_size: int,
        burst: bool,
        max_messages: int | None,
        lease: timedelta | None,
        poll_interval: float,
        reseed_interval: float | None,
        summary_interval: float | None,
    ) -> None:
        self.plans = list(plans)
        #: the databases of the plans' queues (each round prunes their ``unique_for`` ledger)
        self.databases = sorted({p.engine.database for p in self.plans})
        self.slots = slots
        self.units = units
        self.reporter = reporter
        self.stats = reporter.stats
        self.queue_limits = queue_limits
        self.groups = groups
        self.registry = registry
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.batch_size = batch_size
        self.burst = burst
        self.max_messages = max_messages
        self.lease = lease
        self.poll_interval = poll_interval
        self.reseed_interval = reseed_interval
        self.summary_interval = summary_interval
        #: units each thread may hold now (adaptive: see ``adapt``)
        self.depth = 1 if self.prefetch is None else self.prefetch
        if any(p.batch for p in self.plans):  # claims again while fewer units than this wait
            slots.low_water = concurrency * BATCH_UNITS_AHEAD
            if self.prefetch is None:  # (adaptive: one ahead from the first claim on)
                self.depth = 2
        #: (queue, key) -> times an ordered queue's message was given back behind its key's
        #: head in this worker, least recent first (its wait grows: ``ordering.wait``)
        self.waits: OrderedDict[tuple[str, tuple[Any, ...]], int] = OrderedDict()
        #: the lease the last receive got, in seconds (None: the engine gives none)
        self.lease_seconds: float | None = None
        #: labels of this worker's queues paused by an operator (``controls``): read before the
        #: first round, then every ``PAUSE_CHECK_SECONDS`` by the ``sq-pauses`` thread (a read
        #: that waits out a database outage never holds up the intake or a stop)
        self.paused: frozenset[str] = frozenset()
        #: monotonic time of the next re-seed of periodic schedules (0: at the next round)
        self.next_seed = 0.0
        #: receive failures per queue (label): each queue fails, backs off and recovers alone
        self.health = {p.label: QueueHealth(p.label) for p in self.plans}
        #: burst: the failing queues it gave up on (``BurstFailed``), described
        self.gave_up: list[str] = []
        #: burst: keys of the messages given back because no receiver of this worker matches
        #: them, by queue label (at most ``BURST_UNMATCHED_KEPT`` in all): found again, they
        #: are no work of this worker's, and the burst may end with them in the queue
        self.unmatched_keys: dict[str, set[tuple[Any, ...]]] = {p.label: set() for p in self.plans}
        self._unmatched_kept = 0
        self._next_summary: float | None = None
        if lease is not None:  # (as ``api.receive`` would: the intake asks each engine itself)
            for plan in self.plans:
                if not plan.engine.features.supports_custom_lease:
                    api._warn_lease_ignored(plan.model, plan.engine.alias)

    def run(self) -> None:
        """Claim while there are free slots, until stopped (or, with ``burst``, until a whole
        round finds nothing due while nothing is held, no queue is failing and every engine
        says no row is leased to this process and unread and its last look at the queue found
        nothing due but messages this worker gave back unmatched, the engine's
        ``settle_receiving``;
        or after ``max_messages``). Serving several queues a receive only takes what a stream
        holds (``fill``): an empty round is no proof, the engines' look is. Between
        rounds it re-seeds the periodic schedules and emits summaries. A queue whose receive
        raises fails alone (``queue_failed``): it backs off, the others go on. A queue at
        its limit (``limits.QueueLimits``) is skipped."""
        slots = self.slots
        start = 0
        if self.summary_interval:
            self._next_summary = time.monotonic() + self.summary_interval
        if self.burst:
            self._settled(wait=0)  # from now on, streams receive in calls that end on their own
        self.check_paused()  # a worker started while a queue is paused never receives from it
        threading.Thread(target=self._watch_pauses, name="sq-pauses", daemon=True).start()
        while True:
            with slots.cond:
                self.slots.wait_until(lambda: slots.stopping or self._wants_more())
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
            self.seed()
        if self._next_summary is not None and time.monotonic() >= self._next_summary:
            self.reporter.emit("summary", stats=self.stats.copy())
            self._next_summary = time.monotonic() + (self.summary_interval or 0)

    def _round(self, start: int) -> int:
        """One round over the queues, from the ``start``-th: receive from each that is not
        paused, backing off or at its limit while slots are free. Returns how many came."""
        got = 0
        for db in self.databases:
            # (as ``api.receive``: the unique_for ledger, when a claim of this process marked
            # it, in a transaction of its own, between claims)
            uniqueness.prune_if_due(db)
            ordering.prune_if_due(db)  # (the ordering keys that sent nothing for a day)
        for offset in range(len(self.plans)):
            plan = self.plans[(start + offset) % len(self.plans)]
            health = self.health[plan.label]
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
                n = self.fill(plan, want)
            except Exception as exc:
                self.queue_failed(health, exc)
                continue
            self.queue_limits.received(plan, n)
            if health.failing:
                self._queue_recovered(health)
            got += n
            if self.prefetch is None:
                self.adapt(full=n >= want)
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
        failing = [h for h in self.health.values() if h.failing]
        if self.burst and not failing:
            return self._burst_idle(idle_before)
        if self.burst and idle_before and self._given_up(failing):
            return True
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

    def _given_up(self, failing: list[QueueHealth]) -> bool:
        """Burst, a round that found nothing while nothing was in flight: True (over, the
        worker raises ``BurstFailed``) when every failing queue has failed each receive for
        ``BURST_GIVE_UP_SECONDS`` and the others are settled (``_settled``: nothing due)."""
        now = time.monotonic()
        if any(h.since is None or now - h.since < BURST_GIVE_UP_SECONDS for h in failing):
            return False
        healthy = [p for p in self.plans if not self.health[p.label].failing]
        if not self._settled(plans=healthy):
            return False
        self.gave_up = [h.describe(now) for h in failing]
        logger.error(
            "burst: giving up on %s: no receive succeeded for %g s",
            ", ".join(self.gave_up),
            BURST_GIVE_UP_SECONDS,
            extra={"action": "burst_failed", "worker_id": self.worker_id},
        )
        return True

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
        # depth 1: a free thread. Otherwise also fewer units waiting than threads (batch
        # receivers: ``BATCH_UNITS_AHEAD`` a thread), so that a claim takes many messages at
        # once rather than one each time one finishes.
        return self.slots.free(self.depth) > 0 and self.slots.waiting < self.slots.low_water

    def _idle_wait(self, seconds: float) -> None:
        with self.slots.cond:
            self.slots.cond.wait_for(lambda: self.slots.stopping, timeout=seconds)

    def fill(self, plan: Plan, want: int) -> int:
        """Receive up to ``want`` messages of ``plan``'s queue into slots (``Slots.hold``) and
        onto ``units``; messages whose lease already expired are skipped. Returns how many
        came."""
        # Serving several queues, a receive takes what a queue's stream holds now: waiting on
        # one queue's stream (native queues) held up every other, and a round over N idle
        # queues took N waits (30 queues: 15 s before a task was run). The streams go on
        # receiving in the background; the next round, ``poll_interval`` later, takes it.
        wait = 0.0 if len(self.plans) > 1 else None
        messages = plan.engine.receive(plan.model, max_messages=want, lease=self.lease, wait=wait)
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
        if plan.options.ordered_by and not plan.engine.features.supports_ordered_receive:
            fresh = self._in_order(plan, fresh)
        deliveries = [Delivery(m, plan, renew_at(m, now), received_at=now) for m in fresh]
        units = [deliveries] if plan.batch else [[d] for d in deliveries]
        units = [u for u in units if u]
        self.reporter.count("received", len(messages))
        self.slots.hold(plan.label, units)
        for unit in units:
            for d in unit:
                self.reporter.emit("received", message=d.message)
            self.units.put(unit)
        return len(messages)

    def _in_order(self, plan: Plan, messages: list[Message]) -> list[Message]:
        """An ordered queue on an engine whose receive has no order (native queues): the
        heads of their ordering keys (``ordering.heads``, one read), to be run; the others
        are given back under their keys, keeping their place, due ``ordering.wait`` later
        (growing with each wait, so that a burst worker sees a gap and stops), in one
        transaction (they never ran: no attempt spent). If the read or the
        give-back fails, nothing of the batch is run (its leases run out: fail closed)."""
        if not messages:
            return messages
        try:
            first, later = ordering.heads(plan.model, messages, using=plan.db)
            if later:
                now = clock.now()
                dues = [now + ordering.wait(self._waited(m)) for m in later]
                run_in_transaction(
                    lambda: plan.policy.resend(plan.model, later, dues, using=plan.db),
                    using=plan.db,
                    retries=plan.retries,
                )
                self.reporter.count("waiting_in_order", len(later))
        except Exception:
            logger.exception(
                "%s: keeping the order of %d received message(s) failed; left to their leases",
                plan.label,
                len(messages),
                extra={"action": "error", "queue": plan.label, "worker_id": self.worker_id},
            )
            return []
        return first

    def _waited(self, message: Message) -> int:
        """Count one more wait of ``message`` behind its key's head; its waits in this worker
        (at most ``WAITS_REMEMBERED`` messages remembered, the least recent forgotten)."""
        key = (message.queue, message.key)
        waits = self.waits.pop(key, 0) + 1
        self.waits[key] = waits
        while len(self.waits) > WAITS_REMEMBERED:
            self.waits.popitem(last=False)
        return waits

    def adapt(self, *, full: bool) -> None:
        """Adaptive prefetch: after a receive, ``depth`` becomes what one thread may hold,
        ``fit = min(AHEAD_SECONDS, lease / 2) / unit_seconds`` (with groups, ``AHEAD_SECONDS`` or
        two groups' time, whichever is longer) (at least 1, at most ``most_ahead()``), so that
        what a thread holds starts well before its lease ends: doubling towards it after a
        receive that came back ``full`` (a backlog), at once down to it when receivers slow
        down. Nothing timed yet: one per free thread."""
        took = self.slots.unit_seconds
        if took is None:
            return
        # a thread that groups holds what two of its groups run (their messages wait for it);
        # AHEAD_SECONDS = 0 holds nothing ahead, groups or not
        groups = 2 * self.groups.longest(self.plans)
        ahead = max(AHEAD_SECONDS, groups) if AHEAD_SECONDS > 0 else 0.0
        budget = ahead if self.lease_seconds is None else min(ahead, self.lease_seconds / 2)
        most = self.most_ahead()
        if took > 0:
            fit = max(1, min(most, int(budget / took)))
        else:  # too quick for the clock
            fit = most if budget > 0 else 1
        self.depth = min(self.depth * 2, fit) if full else min(self.depth, fit)

    def most_ahead(self) -> int:
        """Adaptive prefetch: the most units one thread may hold, ``AUTO_PREFETCH_MAX`` or two
        of its largest groups, whichever is more."""
        return max(AUTO_PREFETCH_MAX, 2 * self.groups.largest(self.plans))

    def seed(self) -> None:
        """Send the first run of every ``periodic`` schedule of this worker's queues whose
        message is missing (at start, every ``reseed_interval`` and after a message was
        dead-lettered or discarded): a schedule whose message was dead-lettered, discarded
        or deleted starts again without a restart."""
        if self.reseed_interval is not None:
            self.next_seed = time.monotonic() + self.reseed_interval
        try:
            for message in seed_schedules([p.label for p in self.plans], registry=self.registry):
                logger.info("seeded periodic schedule %s", message, extra={"action": "seeded"})
        except Exception:
            logger.exception("seeding periodic schedules failed", extra={"action": "error"})

    def _watch_pauses(self) -> None:
        """The pause watcher thread: ``check_paused`` every ``PAUSE_CHECK_SECONDS`` until the
        worker stops."""
        try:
            while True:
                with self.slots.cond:
                    if self.slots.cond.wait_for(
                        lambda: self.slots.stopping, timeout=controls.PAUSE_CHECK_SECONDS
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
                plan.engine.stop_receiving(plan.model, wait=0)
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

    def _settled(self, wait: float | None = None, plans: list[Plan] | None = None) -> bool:
        """No queue of this worker (of ``plans``, when given) has rows leased to this process
        and unread, and each engine's last look found nothing due but messages this worker
        gave back unmatched (the engine's ``settle_receiving``). Every queue is asked at once
        first (``wait=0``: their looks run together, one brief call's time, not one per
        queue), then each is waited for. A queue whose settle raises is failing
        (``queue_failed``): not settled."""
        pending = []
        for plan in self.plans if plans is None else plans:
            if not self._settle(plan, 0):
                pending.append(plan)
        if wait == 0:
            return not pending
        return all([self._settle(plan, wait) for plan in pending])

    def _settle(self, plan: Plan, wait: float | None) -> bool:
        try:
            return plan.engine.settle_receiving(
                plan.model, wait=wait, ignore=self.unmatched_keys[plan.label]
            )
        except Exception as exc:
            self.queue_failed(self.health[plan.label], exc)
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

    def noted(self, name: str, message: Message) -> None:
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

    def reseed_soon(self) -> None:
        """A message left its queue for good (dead-lettered, discarded): re-seed the periodic
        schedules at the next round."""
        self.next_seed = 0.0
