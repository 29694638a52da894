"""The worker: receive messages, run receivers, ack, retry, renew leases, stop gracefully.

``Worker`` is a plain class; ``manage.py runqueueworker`` is a thin adapter over it. It is put
together from parts of one job each: ``intake`` (receive, prefetch, slots), ``execution``
(executor threads: run receivers, ack in the receiver's transaction), ``outcomes`` (retry,
failure, dead-letter, discard), ``leases`` (the renewer thread), ``events`` (listeners and
counters), ``signals`` (SIGTERM/SIGINT), sharing ``state.Holdings``. Guarantees:

- It never holds more messages than it has free slots: ``concurrency`` threads, each holding
  up to ``prefetch`` units (a batch queue fills one slot with up to ``batch_size`` messages).
  One receive claims up to ``concurrency * prefetch`` minus those held, and, past one unit per
  thread, claims again only when fewer than ``concurrency`` are left waiting. By default
  (``prefetch=None``) the prefetch adapts (``intake``): one unit per free thread until a unit
  was timed, then, while receives come back full, doubling up to what a thread can start within
  ``min(0.25 s, lease / 2)`` at the measured average run time (at most 100); slow receivers
  take one. ``prefetch=N`` fixes it (1: claim only for free threads). Each message is still
  processed on its own, in its own transaction with its ack; waiting messages' leases are
  renewed like running ones; a waiting message whose lease was lost or has expired is not run.
  On ``stop()`` messages that were prefetched but not started are given back due now without
  spending an attempt (first delivery: ack and re-send in one transaction) or, if they had
  failed before, run first.
- An ``atomic`` receiver's writes and the ack of its message commit in one transaction.
- ``raise Retry(after=...)``: the receiver's writes roll back; the message is acked and sent
  again under the same key, due ``after`` later, in one transaction.
- Any other exception: the transaction rolls back, the error is logged with queue, key and
  attempt, and the message is released due after the engine's back-off (or, if the engine
  cannot release, left to its lease expiry). Past ``QueueMeta.max_attempts`` the message moves to
  the queue's dead-letter queue, or is dropped (logged) with ``discard_after_max_attempts``.
- Leases are renewed in the background halfway through each lease. If a renewal loses a lease,
  the worker no longer treats the message as its own: it does not ack, retry or release it.
- A queue whose receive raises (dropped, a missing grant, unreachable) fails alone: it backs
  off (doubling, at most ``intake.QUEUE_BACKOFF_MAX`` seconds) while the other queues go on,
  shows in ``queue_health()``, the summary line and the ``receive_failed`` /
  ``queue_recovered`` events, and is logged once per failure episode.
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
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from spanner_queues import api
from spanner_queues.exceptions import InvalidArgument, WorkerCrashed, WorkerStuck
from spanner_queues.receivers import ReceiverRegistry, receivers
from spanner_queues.worker.events import (
    FINAL_EVENTS,
    Emitter,
    WorkerEvent,
    WorkerEvents,
    WorkerStats,
)
from spanner_queues.worker.execution import Execution, recycle_connections
from spanner_queues.worker.intake import SIGNAL_SLICE, Intake, plan_queues
from spanner_queues.worker.leases import Renewer
from spanner_queues.worker.limits import STUCK_GRACE_SECONDS, TimeLimits
from spanner_queues.worker.outcomes import PARKED_UNTIL, Outcomes
from spanner_queues.worker.signals import StopOnSignal, abort_process, on_stop
from spanner_queues.worker.state import Config, Holdings, Plan, QueueHealth

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
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout < float("inf")
        ):
            raise InvalidArgument(f"timeout must be a positive number of seconds, not {timeout!r}.")
        if (
            isinstance(stuck_grace, bool)
            or not isinstance(stuck_grace, (int, float))
            or not (0 < stuck_grace < float("inf"))
        ):
            raise InvalidArgument(f"stuck_grace must be a positive number, not {stuck_grace!r}.")
        #: seconds between re-seeds of the periodic schedules while running (None: at start only)
        self.reseed_interval = reseed_interval
        #: time limit in seconds of receivers that set none (None: no limit)
        self.timeout = timeout
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.batch_size = batch_size
        self.burst = burst
        self.max_messages = max_messages
        self.lease = lease
        self.poll_interval = poll_interval
        self.worker_id = worker_id or _default_worker_id()
        self.registry = registry if registry is not None else receivers
        self.install_signal_handlers = install_signal_handlers
        self.summary_interval = summary_interval
        self.plans: list[Plan] = plan_queues(queues, self.registry, batch_size)

        self.held = Holdings()
        self.events = Emitter(self.worker_id, listeners, self.held.cond)
        self.outcomes = Outcomes(self.held, self.events)
        self.limits = TimeLimits(self.held, self.events, default=timeout, grace=stuck_grace)
        #: how this worker runs, as its parts read it
        self.config = Config(
            plans=tuple(self.plans),
            registry=self.registry,
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
        self.execution = Execution(self.held, self.events, self.outcomes, self.limits, self.config)
        self.intake = Intake(self.held, self.events, self.config)
        self.leases = Renewer(self.held, self.events)
        self._on_signal = StopOnSignal(self.stop, lambda: self.stopping, self.events.emit, abort)

    @property
    def queue_labels(self) -> list[str]:
        return [p.label for p in self.plans]

    @property
    def listeners(self) -> list[Callable[[WorkerEvent], None]]:
        return self.events.listeners

    @property
    def stats(self) -> WorkerStats:
        """Counters since the worker started (live; ``copy()`` for a snapshot)."""
        return self.events.stats

    def queue_health(self) -> dict[str, QueueHealth]:
        """Receive failures per queue (label): a queue whose receives fail (dropped, missing
        permission, unreachable) is ``failing`` and backs off alone while the others go on
        (live objects of the intake thread; read them, do not change them)."""
        return dict(self.intake.health)

    @property
    def crashed(self) -> BaseException | None:
        """The first BaseException (not an Exception) a receiver raised; run() re-raises it."""
        return self.held.crashed

    # --- control ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop receiving; in-flight messages are finished and acked; ``run()`` returns."""
        self.held.stop()

    @property
    def stopping(self) -> bool:
        return self.held.stopping

    def run(self) -> WorkerStats:
        """Run until stopped (or, with ``burst``, until nothing is due; or after
        ``max_messages``). Returns the final counters."""
        held = self.held
        use_signals = (
            self.install_signal_handlers and threading.current_thread() is threading.main_thread()
        )
        guard = on_stop(self._on_signal) if use_signals else contextlib.nullcontext()
        with guard:
            threads = [
                threading.Thread(target=self.execution.run, name=f"sq-worker-{i}", daemon=True)
                for i in range(self.concurrency)
            ]
            renewer = threading.Thread(target=self.leases.run, name="sq-renewer", daemon=True)
            watchdog = threading.Thread(target=self.limits.run, name="sq-watchdog", daemon=True)
            for t in threads:
                t.start()
            renewer.start()
            watchdog.start()
            logger.info(
                "worker %s started: queues=%s concurrency=%d",
                self.worker_id,
                ",".join(self.queue_labels),
                self.concurrency,
                extra={"action": "started"},
            )
            self.events.emit("worker_started")
            try:
                self.intake.seed()
                self.intake.loop()
                # Ended by burst or max_messages: finish what is held, prefetched included
                # (a stop() meanwhile releases the messages not yet started).
                with held.cond:
                    while not held.cond.wait_for(
                        lambda: held.stopping or held.in_flight == 0, timeout=SIGNAL_SLICE
                    ):
                        pass  # (in slices: a signal handler runs between them)
            finally:
                self.stop()
                self._stop_streams()
                with held.cond:  # (a stuck receiver is not waited for: see limits)
                    while not held.cond.wait_for(
                        lambda: held.in_flight <= held.stuck_units, timeout=SIGNAL_SLICE
                    ):
                        pass  # (in slices: a second signal still aborts at once)
                for _ in threads:
                    held.units.put(None)
                for t in threads:
                    if t.ident not in self.limits.stuck_threads:
                        t.join()
                with held.cond:
                    held.renew_cond.notify_all()
                renewer.join()
                self.limits.wake.set()
                watchdog.join()
            self.events.emit("summary", stats=self.stats.copy())
            self.events.emit("stopped", stats=self.stats.copy())
            logger.info("worker %s stopped", self.worker_id, extra={"action": "stopped"})
        if self.held.stuck_units:
            raise WorkerStuck(
                f"worker {self.worker_id} stopped: {self.held.stuck_units} receiver(s) still "
                f"running {self.limits.grace:g} s past their time limit could not be "
                "interrupted; restart the process"
            )
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
