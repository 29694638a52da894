"""The worker: receive messages, run receivers, ack, retry, renew leases, stop gracefully.

``Worker`` is a plain class; ``manage.py runqueueworker`` is a thin adapter over it. Guarantees:

- It never holds more messages than it has free slots (``concurrency`` threads): a receive asks
  for at most the free slots (a batch queue fills one slot with up to ``batch_size`` messages).
  With ``prefetch=N`` (opt-in, default 1) it holds up to ``N`` units per thread: one receive
  claims up to ``concurrency * N`` minus those held, and claims again only when fewer than
  ``concurrency`` are left waiting. Each message is still processed on its own, in its own
  transaction with its ack; waiting messages' leases are renewed like running ones; a waiting
  message whose lease was lost or has expired is not run. On ``stop()`` messages that were
  prefetched but not started are given back due now without spending an attempt (first
  delivery: ack and re-send in one transaction) or, if they had failed before, run first.
- An ``atomic`` receiver's writes and the ack of its message commit in one transaction.
- ``raise Retry(after=...)``: the receiver's writes roll back; the message is acked and sent
  again under the same key, due ``after`` later, in one transaction.
- Any other exception: the transaction rolls back, the error is logged with queue, key and
  attempt, and the message is released due after the engine's back-off (or, if the engine
  cannot release, left to its lease expiry). Past ``QueueMeta.max_attempts`` the message moves to
  the queue's dead-letter queue, or is dropped (logged) with ``discard_after_max_attempts``.
- Leases are renewed in the background halfway through each lease. If a renewal loses a lease,
  the worker no longer treats the message as its own: it does not ack, retry or release it.
- ``stop()`` (first SIGTERM/SIGINT): receive nothing more, finish and ack in-flight messages,
  return. A second signal ends the process at once with exit status 1.
- A receiver that raises a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
  ``KeyboardInterrupt``...): its transaction rolls back, the error is logged (``critical``), the
  worker stops as on ``stop()`` and ``run()`` raises ``WorkerCrashed`` from it; the message is
  left leased (not released, not acked) and is delivered again after its lease.
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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.utils import timezone

from spanner_queues import api
from spanner_queues.deadletter import dead_letter
from spanner_queues.drivers import driver_for
from spanner_queues.exceptions import (
    InvalidArgument,
    LeaseLost,
    MessageAlreadyAcked,
    MessageAlreadyExists,
    QueueConfigurationError,
    Retry,
    WorkerCrashed,
)
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.receivers import (
    NoReceiver,
    ReceiverRegistry,
    ReceiverSpec,
    acked_by_receiver,
    receivers,
    set_pending,
)
from spanner_queues.registry import engine_for, get_queue
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from spanner_queues.models import Queue

logger = logging.getLogger("spanner_queues.worker")

__all__ = ["Worker", "WorkerEvent", "WorkerEvents", "WorkerStats", "on_stop"]

#: events after which a message has left the worker's hands
FINAL_EVENTS = frozenset(
    {
        "acked",
        "failed",
        "retried",
        "dead_lettered",
        "discarded",
        "lease_lost",
        "already_acked",
        "returned",
        "crashed",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerEvent:
    """Something the worker did. ``message`` is set for per-message events."""

    name: str
    worker_id: str
    message: Message | None = None
    receiver: str | None = None
    duration: float | None = None
    error: BaseException | None = None
    stats: WorkerStats | None = None


@dataclass(slots=True)
class WorkerStats:
    """Counters since the worker started (a snapshot when carried by an event)."""

    received: int = 0
    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    discarded: int = 0
    lease_lost: int = 0
    already_acked: int = 0
    #: prefetched messages given back unstarted at stop
    returned: int = 0
    started: float = field(default_factory=time.monotonic)

    def copy(self) -> WorkerStats:
        return WorkerStats(**{name: getattr(self, name) for name in self.__slots__})


class WorkerEvents:
    """A listener that records events and lets tests wait for them (no sleeps)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.counts: Counter[str] = Counter()
        self.history: list[WorkerEvent] = []

    def __call__(self, event: WorkerEvent) -> None:
        with self._cond:
            self.counts[event.name] += 1
            self.history.append(event)
            self._cond.notify_all()

    def wait_for(self, name: str, count: int = 1, timeout: float = 30.0) -> bool:
        """Block until ``name`` happened ``count`` times; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.counts[name] >= count, timeout)

    def messages(self, name: str) -> list[Message]:
        with self._cond:
            return [e.message for e in self.history if e.name == name and e.message]


@dataclass(eq=False, slots=True)
class _Delivery:
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


@dataclass(frozen=True, slots=True)
class _Plan:
    model: type[Queue]
    specs: tuple[ReceiverSpec, ...]
    batch: bool
    batch_size: int

    @property
    def label(self) -> str:
        return self.model._meta.label


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


#: where a message whose key clashes in its dead-letter queue waits for an operator
PARKED_UNTIL = datetime(8999, 1, 1, tzinfo=dt_timezone.utc)
#: most receiver threads one worker process runs (each is a thread and a database connection)
MAX_CONCURRENCY = 1024
#: most units each thread may hold (prefetch)
MAX_PREFETCH = 1000


def _require_int(name: str, value: Any, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidArgument(f"{name} must be an int of at least {low}, not {value!r}.")
    if high is not None and value > high:
        raise InvalidArgument(
            f"{name} must be at most {high}, not {value} (each receiver thread holds a database "
            "connection; run more worker processes instead)."
        )


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _abort_process() -> None:
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
        prefetch: int = 1,
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
        abort: Callable[[], None] = _abort_process,
    ) -> None:
        _require_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
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
        #: seconds between re-seeds of the periodic schedules while running (None: at start only)
        self.reseed_interval = reseed_interval
        self._next_seed = 0.0
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.batch_size = batch_size
        self.burst = burst
        self.max_messages = max_messages
        self.lease = lease
        self.poll_interval = poll_interval
        self.worker_id = worker_id or _default_worker_id()
        self.registry = registry if registry is not None else receivers
        self.listeners = list(listeners)
        self.install_signal_handlers = install_signal_handlers
        self.summary_interval = summary_interval
        self._abort = abort
        self.plans = self._plan(queues)
        self.stats = WorkerStats()

        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # the renewer's own wake-ups (new deliveries, stop), not one per finished message
        self._renew_cond = threading.Condition(lock)
        self._renew_lock = threading.RLock()
        self._stopping = False
        self._in_flight = 0  # units (slots) taken, running or waiting
        self._waiting = 0  # units received and not yet taken by an executor
        self._deliveries: set[_Delivery] = set()  # held: running or waiting
        self._units: SimpleQueue[list[_Delivery] | None] = SimpleQueue()
        self._per_queue: dict[type[Queue], tuple[str, Any, Any]] = {}
        #: the first BaseException (not an Exception) a receiver raised; run() re-raises it
        self.crashed: BaseException | None = None

    # --- configuration ----------------------------------------------------------------------
    def _plan(self, queues: Sequence[str | type[Queue]] | None) -> list[_Plan]:
        by_queue = self.registry.by_queue()  # raises for receivers of undeclared queues
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
            size = max((s.max_batch_size or self.batch_size) for s in specs) if batch else 1
            plans.append(_Plan(get_queue(label), specs, batch, size))
        return plans

    @property
    def queue_labels(self) -> list[str]:
        return [p.label for p in self.plans]

    # --- events -----------------------------------------------------------------------------
    def _emit(self, name: str, **info: Any) -> None:
        if not self.listeners:
            return
        event = WorkerEvent(name=name, worker_id=self.worker_id, **info)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("worker event listener failed on %s", name)

    def _count(self, name: str, n: int = 1) -> None:
        with self._cond:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    # --- control ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop receiving; in-flight messages are finished and acked; ``run()`` returns."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            self._renew_cond.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self._stopping:
            logger.warning(
                "%s received: finishing in-flight messages, then exiting (send it again to "
                "exit at once).",
                name,
                extra={"action": "stopping"},
            )
            self._emit("stopping")
            self.stop()
        else:
            logger.warning(
                "%s received again: exiting now; unacked messages are redelivered after "
                "their lease.",
                name,
                extra={"action": "abort"},
            )
            self._abort()

    # --- main loop --------------------------------------------------------------------------
    def run(self) -> WorkerStats:
        """Run until stopped (or, with ``burst``, until nothing is due; or after
        ``max_messages``). Returns the final counters."""
        use_signals = (
            self.install_signal_handlers and threading.current_thread() is threading.main_thread()
        )
        guard = on_stop(self._on_signal) if use_signals else contextlib.nullcontext()
        with guard:
            threads = [
                threading.Thread(target=self._executor, name=f"sq-worker-{i}", daemon=True)
                for i in range(self.concurrency)
            ]
            renewer = threading.Thread(target=self._renewer, name="sq-renewer", daemon=True)
            for t in threads:
                t.start()
            renewer.start()
            logger.info(
                "worker %s started: queues=%s concurrency=%d",
                self.worker_id,
                ",".join(self.queue_labels),
                self.concurrency,
                extra={"action": "started"},
            )
            self._emit("worker_started")
            try:
                self._seed()
                self._loop()
                # Ended by burst or max_messages: finish what is held, prefetched included
                # (a stop() meanwhile releases the messages not yet started).
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping or self._in_flight == 0)
            finally:
                self.stop()
                self._stop_streams()
                with self._cond:
                    self._cond.wait_for(lambda: self._in_flight == 0)
                for _ in threads:
                    self._units.put(None)
                for t in threads:
                    t.join()
                with self._cond:
                    self._renew_cond.notify_all()
                renewer.join()
            self._emit("summary", stats=self.stats.copy())
            self._emit("stopped", stats=self.stats.copy())
            logger.info("worker %s stopped", self.worker_id, extra={"action": "stopped"})
        if self.crashed is not None:
            raise WorkerCrashed(
                f"worker {self.worker_id} stopped: a receiver raised "
                f"{type(self.crashed).__name__}: {self.crashed}"
            ) from self.crashed
        return self.stats.copy()

    def _stop_streams(self) -> None:
        """No background RECEIVE stream outlives the worker (native engine)."""
        for label in self.queue_labels:
            try:
                api.stop_receiving(label, wait=5)
            except Exception:
                logger.exception("stopping the receive stream of %s failed", label)

    def _seed(self) -> None:
        """Send the first run of every ``periodic`` schedule of this worker's queues whose
        message is missing (at start, every ``reseed_interval`` and after a message was
        dead-lettered or discarded): a schedule whose message was dead-lettered, discarded
        or deleted starts again without a restart."""
        from spanner_queues.patterns import seed_schedules

        if self.reseed_interval is not None:
            self._next_seed = time.monotonic() + self.reseed_interval
        try:
            for message in seed_schedules(self.queue_labels, registry=self.registry):
                logger.info("seeded periodic schedule %s", message, extra={"action": "seeded"})
        except Exception:
            logger.exception("seeding periodic schedules failed", extra={"action": "error"})

    def _free_slots(self) -> int:
        return self.concurrency * self.prefetch - self._in_flight

    def _wants_more(self) -> bool:
        # prefetch=1: a free thread. Otherwise also fewer units waiting than threads, so that
        # a claim takes many messages at once rather than one each time one finishes.
        return self._free_slots() > 0 and self._waiting < self.concurrency

    def _loop(self) -> None:
        start = 0
        errors = 0
        next_summary = time.monotonic() + self.summary_interval if self.summary_interval else None
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._wants_more())
                if self._stopping:
                    return
                idle_before = self._in_flight == 0
            if self.reseed_interval is not None and time.monotonic() >= self._next_seed:
                self._seed()
            if next_summary is not None and time.monotonic() >= next_summary:
                self._emit("summary", stats=self.stats.copy())
                next_summary = time.monotonic() + (self.summary_interval or 0)
            got = 0
            try:
                for offset in range(len(self.plans)):
                    plan = self.plans[(start + offset) % len(self.plans)]
                    with self._cond:
                        free = self._free_slots()
                    if free <= 0 or self._stopping:
                        break
                    if plan.batch:
                        want = plan.batch_size
                    elif self.prefetch == 1:
                        want = min(free, self.batch_size)
                    else:
                        want = free
                    if self.max_messages is not None:
                        want = min(want, self.max_messages - self.stats.received)
                    if want <= 0:
                        break
                    got += self._receive(plan, want)
                errors = 0
            except Exception:
                errors += 1
                logger.exception("receive failed (%d in a row)", errors, extra={"action": "error"})
                self._idle_wait(min(5.0, max(self.poll_interval, 0.1) * 2**errors))
                continue
            start += 1
            if self.max_messages is not None and self.stats.received >= self.max_messages:
                return
            if got:
                continue
            if self.burst:
                if idle_before:
                    return  # a whole round found nothing due while nothing was in flight
                with self._cond:  # wait for in-flight work to finish, then look again
                    busy = self._in_flight
                    self._cond.wait_for(
                        lambda busy=busy: self._stopping or self._in_flight < busy, timeout=1.0
                    )
                continue
            self._emit("idle")
            self._idle_wait(self.poll_interval * random.uniform(0.5, 1.0))
            recycle_connections()

    def _idle_wait(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, timeout=seconds)

    def _receive(self, plan: _Plan, want: int) -> int:
        messages = api.receive(plan.model, max_messages=want, lease=self.lease)
        if not messages:
            return 0
        now = timezone.now()
        fresh = [m for m in messages if m.lease_expires_at is None or m.lease_expires_at > now]
        if len(fresh) < len(messages):  # sat too long in a buffer: someone else's now
            logger.warning(
                "%d received message(s) of %s had an expired lease; skipped",
                len(messages) - len(fresh),
                plan.label,
            )
        deliveries = [
            _Delivery(message=m, model=plan.model, renew_at=_renew_at(m, now)) for m in fresh
        ]
        units = [deliveries] if plan.batch else [[d] for d in deliveries]
        with self._cond:
            self.stats.received += len(messages)
            self._deliveries.update(deliveries)
            taken = len([u for u in units if u])
            self._in_flight += taken
            self._waiting += taken
            self._renew_cond.notify_all()
        for unit in units:
            if unit:
                for d in unit:
                    self._emit("received", message=d.message)
                self._units.put(unit)
        return len(messages)

    # --- executing --------------------------------------------------------------------------
    def _executor(self) -> None:
        try:
            while True:
                unit = self._units.get()
                if unit is None:
                    return
                with self._cond:
                    self._waiting -= 1
                    unstarted = self._stopping and self.prefetch > 1
                    if self.prefetch > 1 and self._waiting == self.concurrency - 1:
                        self._cond.notify_all()  # below the low-water mark: claim more
                try:
                    plan = next(p for p in self.plans if p.model is unit[0].model)
                    if unstarted:
                        self._return_unstarted(plan, unit)
                    elif plan.batch:
                        self._run_batch(plan, unit)
                    else:
                        self._run_single(plan, unit[0])
                except Exception:
                    logger.exception("worker error; message(s) left to lease expiry")
                except BaseException as exc:  # SystemExit, KeyboardInterrupt... from a receiver
                    self._crash(unit, exc)
                finally:
                    with self._cond:
                        for d in unit:
                            d.done = True
                        self._deliveries.difference_update(unit)
                        self._in_flight -= 1
                        self._cond.notify_all()
                        if self._stopping and self._in_flight == 0:
                            self._renew_cond.notify_all()
                    recycle_connections()
        finally:
            connections.close_all()

    def _crash(self, unit: list[_Delivery], exc: BaseException) -> None:
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
                extra=_extra("crashed", d.message),
            )
            self._emit("crashed", message=d.message, error=exc)
        with self._cond:
            if self.crashed is None:
                self.crashed = exc
        self.stop()

    def _database(self, model: type[Queue]) -> str:
        return self._cached(model)[0]

    def _cached(self, model: type[Queue]) -> tuple[str, Any, Any]:
        """(database alias, engine, QueueOptions) of a queue, looked up once per worker."""
        cached = self._per_queue.get(model)
        if cached is None:
            cached = (api._database(model, None), engine_for(model), queue_options(model))
            self._per_queue[model] = cached
        return cached

    @contextlib.contextmanager
    def _lease_lock(self, model: type[Queue]) -> Iterator[None]:
        """``_renew_lock`` for writing leases of ``model`` (renew, release, give back), taken
        after the database's write lock (SQLite: one per file and process), in the order of a
        receiver's transaction, which holds the write lock and then takes ``_renew_lock`` to
        ack. The other order deadlocked: the ack waited for ``_renew_lock`` while its holder
        waited for the write lock."""
        with driver_for(self._database(model)).write_lock(), self._renew_lock:
            yield

    def _still_mine(self, deliveries: list[_Delivery]) -> list[_Delivery]:
        """The deliveries whose lease is still held; the others (lost by renewal, or expired
        while waiting in the prefetch buffer) are reported and not run."""
        now = timezone.now()
        mine, lost = [], []
        for d in deliveries:
            expires = d.message.lease_expires_at
            if d.lease_lost or (expires is not None and expires <= now):
                lost.append(d)
            else:
                mine.append(d)
        if lost:
            self._lease_lost(lost, LeaseLost("lease lost or expired before the receiver ran"))
        return mine

    def _return_unstarted(self, plan: _Plan, unit: list[_Delivery]) -> None:
        """At stop: give back prefetched messages that were not started, due now, without
        spending one of their attempts (the claim counted one; a release would keep it, and
        enough graceful stops would then dead-letter a message that never ran):

        - first delivery (attempt 1): ack and send it again under its key in one transaction,
          as if it had never been received (attempts back to 0; its send time restarts);
        - a later delivery (it failed before): run it now, like in-flight work, so that its
          attempt is one that ran;
        - engines that count no attempts: release it where the engine can release, else leave
          it to its lease expiry.
        """
        run_now = []
        for d in unit:
            db, engine, _ = self._cached(d.model)
            features = engine.features
            if features.supports_attempt_count and d.message.attempt > 1:
                run_now.append(d)
                continue
            with self._lease_lock(d.model):
                if d.lease_lost:
                    continue
                m = d.message
                try:
                    if features.supports_attempt_count:
                        run_in_transaction(
                            lambda m=m, db=db, model=d.model: (
                                api.ack_many(model, [m], using=db),
                                api.send_many(
                                    model, [dict(m.key_dict, payload=m.payload)], using=db
                                ),
                            ),
                            using=db,
                            retries=engine.params.transaction_retries,
                        )
                    elif features.supports_release:
                        api.release(m)
                    else:
                        continue  # left to its lease expiry
                except (LeaseLost, MessageAlreadyAcked):
                    logger.warning("%s: lease lost before it was given back", m)
                    continue
                except Exception:
                    logger.exception("%s: giving it back failed; left to lease expiry", m)
                    continue
            self._count("returned")
            logger.debug(
                "%s: prefetched, not started; given back at stop",
                d.message,
                extra=_extra("returned", d.message),
            )
            self._emit("returned", message=d.message)
        if run_now:
            if plan.batch:
                self._run_batch(plan, run_now)
            else:
                for d in run_now:
                    self._run_single(plan, d)

    def _run_single(self, plan: _Plan, delivery: _Delivery) -> None:
        if not self._still_mine([delivery]):
            return
        message = delivery.message
        if self._over_limit(delivery):
            self._give_up([delivery], None)
            return
        try:
            spec = self.registry.route(plan.specs, message)
        except NoReceiver as exc:
            self._failed([delivery], exc, None)
            return
        self._execute(spec, [delivery])

    def _run_batch(self, plan: _Plan, deliveries: list[_Delivery]) -> None:
        todo = []
        for d in self._still_mine(deliveries):
            if self._over_limit(d):
                self._give_up([d], None)
            else:
                todo.append(d)
        groups: dict[str, tuple[ReceiverSpec, list[_Delivery]]] = {}
        for d in todo:
            try:
                spec = self.registry.route(plan.specs, d.message)
            except NoReceiver as exc:
                self._failed([d], exc, None)
                continue
            groups.setdefault(spec.name, (spec, []))[1].append(d)
        for spec, group in groups.values():
            size = spec.max_batch_size or self.batch_size
            for i in range(0, len(group), size):
                self._execute(spec, group[i : i + size])

    def _execute(self, spec: ReceiverSpec, deliveries: list[_Delivery]) -> None:
        model = deliveries[0].model
        db, engine, _ = self._cached(model)
        retries = engine.params.transaction_retries
        started = time.monotonic()
        for d in deliveries:
            self._emit("started", message=d.message, receiver=spec.name)

        by_key = {(d.message.queue, d.message.key): d for d in deliveries}

        def current(message: Message) -> Message:
            """The lease held now, for an ack by the receiver's code (a pattern helper)."""
            return self._freeze([by_key[(message.queue, message.key)]])[0]

        def body() -> None:
            with self._renew_lock:  # (again on a retried transaction: renew while it runs)
                for d in deliveries:
                    d.acking = False
            messages = [d.message for d in deliveries]
            # (again on a retried transaction: its acks rolled back)
            set_pending(messages, current=current)
            spec.func(messages if spec.batch else messages[0])
            if spec.atomic:
                self._ack(deliveries, db)

        try:
            try:
                if spec.atomic:
                    run_in_transaction(body, using=db, retries=retries)
                else:
                    body()  # outside any transaction: external side effects, then ack
                    run_in_transaction(lambda: self._ack(deliveries, db), using=db, retries=retries)
            finally:
                set_pending(None)
        except Retry as exc:
            self._retry(deliveries, exc, spec, time.monotonic() - started)
        except LeaseLost as exc:
            self._lease_lost(deliveries, exc)
        except MessageAlreadyAcked as exc:
            self._count("already_acked", len(deliveries))
            for d in deliveries:
                logger.warning(
                    "%s: already acked by someone else (its lease had expired); this "
                    "delivery's transaction was rolled back",
                    d.message,
                    extra=_extra("already_acked", d.message),
                )
                self._emit("already_acked", message=d.message, receiver=spec.name, error=exc)
        except Exception as exc:
            self._failed(deliveries, exc, spec, time.monotonic() - started)
        else:
            duration = time.monotonic() - started
            self._count("processed", len(deliveries))
            for d in deliveries:
                logger.debug(
                    "%s attempt %d acked (%s, %.3f s)",
                    d.message,
                    d.message.attempt,
                    spec.name,
                    duration,
                    extra=_extra("acked", d.message),
                )
                self._emit("acked", message=d.message, receiver=spec.name, duration=duration)

    def _ack(self, deliveries: list[_Delivery], db: str) -> None:
        """Ack in the current transaction, unless a lease was lost (then raise LeaseLost)."""
        lost = [d for d in deliveries if d.lease_lost]
        if lost:
            raise LeaseLost(f"{lost[0].message}: lease lost while the receiver ran; not acked.")
        pending = [m for m in self._freeze(deliveries) if not acked_by_receiver(m)]
        if pending:  # (api.ack_many, with the queue's engine already looked up)
            model = deliveries[0].model
            engine = self._cached(model)[1]
            keys = [m.key for m in pending]
            if engine.features.supports_lease_checked_ack:  # the lease held now (renewed)
                tokens = [m.lease_token for m in pending]
                engine.ack_many(model, keys, using=db, lease_tokens=tokens)
            else:
                engine.ack_many(model, keys, using=db)
        failed_before = [d.message.key for d in deliveries if d.message.attempt > 1]
        if failed_before:  # engines with a failure ledger forget it with the ack
            model = deliveries[0].model
            self._cached(model)[1].clear_failures(model, failed_before, using=db)

    def _freeze(self, deliveries: list[_Delivery]) -> list[Message]:
        """The deliveries' messages with the lease held now; no renewal rotates their tokens
        from here on (``acking``)."""
        with self._renew_lock:
            for d in deliveries:
                d.acking = True
            return [d.message for d in deliveries]

    def _retry(
        self, deliveries: list[_Delivery], exc: Retry, spec: ReceiverSpec, duration: float
    ) -> None:
        self._freeze(deliveries)
        mine = [d for d in deliveries if not d.lease_lost]
        if len(mine) < len(deliveries):
            self._lease_lost([d for d in deliveries if d.lease_lost], exc)
        if not mine:
            return
        model = mine[0].model
        db, engine, _ = self._cached(model)

        def move() -> None:
            now = timezone.now()
            api.ack_many(model, [d.message for d in mine], using=db)
            api.send_many(
                model,
                [
                    dict(
                        d.message.key_dict,
                        payload=d.message.payload,
                        deliver_time=now
                        + (exc.after if exc.after is not None else _backoff(d.message, engine)),
                    )
                    for d in mine
                ],
                using=db,
            )

        try:
            run_in_transaction(move, using=db, retries=engine.params.transaction_retries)
        except MessageAlreadyAcked as err:
            for d in mine:
                logger.warning("%s: already acked; not retried", d.message)
                self._emit("already_acked", message=d.message, error=err)
            return
        except LeaseLost as err:  # StaleAck: delivered again or replaced meanwhile
            self._lease_lost(mine, err)
            return
        self._count("retried", len(mine))
        for d in mine:
            logger.info(
                "%s attempt %d: retry after %s%s",
                d.message,
                d.message.attempt,
                exc.after,
                f" ({exc.reason})" if exc.reason else "",
                extra=_extra("retried", d.message),
            )
            self._emit("retried", message=d.message, receiver=spec.name, duration=duration)

    def _lease_lost(self, deliveries: list[_Delivery], exc: BaseException) -> None:
        self._count("lease_lost", len(deliveries))
        for d in deliveries:
            logger.warning(
                "%s attempt %d: lease lost; not acked (it will be delivered again)",
                d.message,
                d.message.attempt,
                extra=_extra("lease_lost", d.message),
            )
            self._emit("lease_lost", message=d.message, error=exc)

    def _over_limit(self, d: _Delivery) -> bool:
        limit = self._cached(d.model)[2].max_attempts
        return bool(limit and d.message.attempt > limit)

    def _failed(
        self,
        deliveries: list[_Delivery],
        exc: BaseException,
        spec: ReceiverSpec | None,
        duration: float | None = None,
    ) -> None:
        self._count("failed", len(deliveries))
        for d in deliveries:
            m = d.message
            logger.error(
                "%s attempt %d failed in %s: %s: %s",
                m,
                m.attempt,
                spec.name if spec else "(no receiver)",
                type(exc).__name__,
                exc,
                exc_info=exc,
                extra=_extra("failed", m),
            )
            self._emit(
                "failed",
                message=m,
                receiver=spec.name if spec else None,
                duration=duration,
                error=exc,
            )
            if d.lease_lost:
                continue
            db, engine, options = self._cached(d.model)
            try:
                attempt = run_in_transaction(
                    lambda m=m, d=d, db=db, engine=engine: engine.record_failure(
                        d.model, m, exc, using=db
                    ),
                    using=db,
                    retries=engine.params.transaction_retries,
                )
            except Exception:
                logger.exception("%s: recording the failure failed", m)
                attempt = m.attempt
            if options.max_attempts and attempt >= options.max_attempts:
                self._give_up([d], exc)
            elif engine.features.supports_release:
                self._release(d)

    def _release(self, d: _Delivery, *, deliver_time: datetime | None = None) -> None:
        engine = self._cached(d.model)[1]
        due = deliver_time or timezone.now() + _backoff(d.message, engine)
        with self._lease_lock(d.model):
            if d.lease_lost:
                return
            try:
                api.release(d.message, deliver_time=due)
            except LeaseLost:
                logger.warning("%s: lease lost before release", d.message)
            except Exception:
                logger.exception("%s: release failed; left to lease expiry", d.message)
            else:
                self._emit("released", message=d.message)

    def _give_up(self, deliveries: list[_Delivery], exc: BaseException | None) -> None:
        for d in deliveries:
            m = self._freeze([d])[0]
            options = self._cached(d.model)[2]
            try:
                if options.dead_letter_queue:
                    dead_letter(m)
                    self._count("dead_lettered")
                    logger.error(
                        "%s: %d attempts, moved to dead-letter queue %s",
                        m,
                        m.attempt,
                        options.dead_letter_queue,
                        extra=_extra("dead_lettered", m),
                    )
                    self._emit("dead_lettered", message=m, error=exc)
                    self._next_seed = 0.0  # a periodic message may have gone: re-seed
                elif options.discard_after_max_attempts:
                    db = self._database(d.model)
                    engine = self._cached(d.model)[1]
                    run_in_transaction(
                        lambda m=m, db=db, model=d.model, engine=engine: (
                            api.ack_many(model, [m], using=db),
                            engine.clear_failures(model, [m.key], using=db),
                        ),
                        using=db,
                    )
                    self._count("discarded")
                    logger.error(  # (no payload bytes: they may hold personal data)
                        "%s: %d attempts, discarded (discard_after_max_attempts); payload of "
                        "%d bytes",
                        m,
                        m.attempt,
                        len(m.payload),
                        extra=_extra("discarded", m),
                    )
                    self._emit("discarded", message=m, error=exc)
                    self._next_seed = 0.0
                elif self._cached(d.model)[1].features.supports_release:
                    self._release(d)
            except MessageAlreadyAcked:
                logger.warning("%s: already acked; nothing to dead-letter", m)
            except LeaseLost:  # StaleAck: delivered again or replaced meanwhile
                logger.warning("%s: lease lost; not dead-lettered (delivered again)", m)
            except MessageAlreadyExists:
                # The dead-letter queue already holds this key (an earlier dead letter, a
                # periodic or heartbeat key). Neither lose nor overwrite it, and do not deliver
                # it again and again: park it in its queue, due at PARKED_UNTIL, logged once.
                # An operator resolves the clash (replay or ack the dead letter), then delivers
                # it now from the admin; it is then dead-lettered.
                logger.error(
                    "%s: %d attempts, but dead-letter queue %s already holds key %r; parked in "
                    "its queue (due %s): resolve the clash in the admin, then deliver it now",
                    m,
                    m.attempt,
                    options.dead_letter_queue,
                    m.key,
                    f"{PARKED_UNTIL:%Y-%m-%d}",
                    extra=_extra("dead_letter_clash", m),
                )
                if self._cached(d.model)[1].features.supports_release:
                    self._release(d, deliver_time=PARKED_UNTIL)

    # --- lease renewal ----------------------------------------------------------------------
    def _renewer(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._stopping and self._in_flight == 0:
                        return
                    now = timezone.now()
                    live = [
                        d
                        for d in self._deliveries
                        if not d.done and not d.lease_lost and not d.acking
                    ]
                    due = [d for d in live if d.renew_at is not None and d.renew_at <= now]
                    if not due:
                        upcoming = [d.renew_at for d in live if d.renew_at is not None]
                        wait = (min(upcoming) - now).total_seconds() if upcoming else 1.0
                        self._renew_cond.wait(timeout=max(0.01, min(wait, 1.0)))
                        continue
                self._renew(due)
        finally:
            connections.close_all()

    def _renew(self, due: list[_Delivery]) -> None:
        by_model: dict[Any, list[_Delivery]] = {}
        for d in due:
            by_model.setdefault(d.model, []).append(d)
        for model, group in by_model.items():
            if not self._cached(model)[1].features.supports_lease_renewal:
                for d in group:
                    d.renew_at = None
                continue
            with self._lease_lock(model):
                group = [d for d in group if not d.done and not d.lease_lost and not d.acking]
                if not group:
                    continue
                try:
                    renewed = api.renew_many([d.message for d in group])
                except Exception:
                    logger.exception("lease renewal failed; trying again")
                    now = timezone.now()
                    for d in group:
                        expires = d.message.lease_expires_at
                        if expires is not None and expires <= now:
                            self._mark_lost(d)
                        else:
                            d.renew_at = now + timedelta(milliseconds=200)
                    continue
                by_key = {m.key: m for m in renewed}
                now = timezone.now()
                for d in group:
                    new = by_key.get(d.message.key)
                    if new is None:
                        self._mark_lost(d)
                    else:
                        d.message = new
                        d.renew_at = _renew_at(new, now)
                        self._emit("renewed", message=new)

    def _mark_lost(self, d: _Delivery) -> None:
        d.lease_lost = True
        logger.warning(
            "%s attempt %d: lease renewal failed; the message is no longer this worker's",
            d.message,
            d.message.attempt,
            extra=_extra("lease_lost", d.message),
        )
        self._emit("renewal_failed", message=d.message)


def recycle_connections() -> None:
    """Between messages: Django's ``close_old_connections()`` (close connections that are
    broken, left in a bad state, or older than ``CONN_MAX_AGE``), except that
    ``CONN_MAX_AGE = 0`` ("close after each request") keeps a healthy connection for the
    thread's life: a message is not a request, and reconnecting per message costs a new
    client per message (on Spanner a new client, session and maintenance thread each time)."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.settings_dict.get("CONN_MAX_AGE") == 0:
            close_at, conn.close_at = conn.close_at, None
            try:
                conn.close_if_unusable_or_obsolete()
            finally:
                if conn.connection is not None:
                    conn.close_at = close_at
        else:
            conn.close_if_unusable_or_obsolete()


def _renew_at(message: Message, now: datetime) -> datetime | None:
    """Halfway through the remaining lease (Spanner extends by 10 s: renew every ~5 s)."""
    if message.lease_expires_at is None:
        return None
    return now + (message.lease_expires_at - now) / 2


def _backoff(message: Message, engine: Any) -> timedelta:
    age = timezone.now() - (message.send_time or timezone.now())
    return engine.params.backoff.delay(max(message.attempt, 1), age)


def _extra(action: str, message: Message) -> dict[str, Any]:
    return {
        "action": action,
        "queue": message.queue,
        "message_key": message.key,
        "attempt": message.attempt,
    }
