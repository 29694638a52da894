"""Execution: the executor threads. Each takes a unit (one message, or one batch), runs its
receiver and acks the messages, in the receiver's transaction when it is ``atomic``:

- An ``atomic`` receiver's writes and the ack of its message commit in one transaction; a
  non-atomic receiver runs outside any transaction, then its messages are acked.
- The ack holds the lease held now (renewals rotate it) and refuses a message whose lease was
  lost while the receiver ran (``LeaseLost``: nothing acked, the writes roll back).
- What happens after a failure, ``Retry``, a lost lease or a message no receiver matches
  (``NoReceiver``) is ``outcomes``'s business; a non-atomic receiver that recorded its failure
  and acked raises ``AckedFailure``: reported failed, nothing given back.
- A receiver that raises a ``BaseException`` that is not an ``Exception``: its transaction rolls
  back, the message is left leased, the worker stops and ``run()`` raises ``WorkerCrashed``.
- A receiver past its time limit (``limits``) is interrupted or, if it returns late, not acked:
  ``TimeLimitExceeded`` fails the delivery like any other error.
"""

from __future__ import annotations

import logging
import time

from django.db import connections

from spanner_queues import clock
from spanner_queues.exceptions import (
    AckedFailure,
    LeaseLost,
    MessageAlreadyAcked,
    Retry,
    TimeLimitExceeded,
)
from spanner_queues.message import Message
from spanner_queues.receivers import (
    MessageContext,
    NoReceiver,
    ReceiverSpec,
    call,
    running,
)
from spanner_queues.transactions import close_lost_connections, run_in_transaction
from spanner_queues.worker.events import Emitter
from spanner_queues.worker.limits import TimeLimits
from spanner_queues.worker.outcomes import Outcomes
from spanner_queues.worker.state import Config, Delivery, Holdings, Plan

logger = logging.getLogger("spanner_queues.worker")


class Execution:
    """Runs units taken from ``held.units`` (see the module docstring)."""

    def __init__(
        self,
        held: Holdings,
        events: Emitter,
        outcomes: Outcomes,
        limits: TimeLimits,
        config: Config,
    ) -> None:
        self.held = held
        self.events = events
        self.outcomes = outcomes
        self.limits = limits
        self.config = config
        prefetch = config.prefetch
        #: units may wait for a thread: prefetch > 1, or adaptive (None)
        self.ahead = prefetch is None or prefetch > 1
        #: a fixed prefetch > 1 gives back every unit not started at stop (adaptive: those
        #: claimed ahead of a free thread, ``Delivery.ahead``)
        self.fixed_prefetch = prefetch is not None and prefetch > 1

    def run(self) -> None:
        """An executor thread: take units and run them until told to end (None)."""
        try:
            while True:
                unit = self.held.units.get()
                if unit is None:
                    return
                unstarted = self.held.take(
                    unit,
                    concurrency=self.config.concurrency,
                    ahead=self.ahead,
                    fixed_prefetch=self.fixed_prefetch,
                )
                started = 0.0
                try:
                    plan = next(p for p in self.config.plans if p.model is unit[0].model)
                    if unstarted:
                        unit_now = self.outcomes.return_unstarted(unit)
                        if unit_now:
                            self.run_unit(plan, unit_now)
                    else:
                        started = time.monotonic()
                        self.run_unit(plan, unit)
                except Exception:
                    logger.exception(
                        "worker error; message(s) left to lease expiry",
                        extra=self.events.log_extra("error", unit[0].message),
                    )
                except BaseException as exc:  # SystemExit, KeyboardInterrupt... from a receiver
                    self.crash(unit, exc)
                finally:
                    took = time.monotonic() - started if started else None
                    self.held.done(unit, took, concurrency=self.config.concurrency)
                    recycle_connections()
        finally:
            connections.close_all()

    def crash(self, unit: list[Delivery], exc: BaseException) -> None:
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
                extra=self.events.log_extra("crashed", d.message),
            )
            self.events.emit("crashed", message=d.message, error=exc)
        with self.held.cond:
            if self.held.crashed is None:
                self.held.crashed = exc
        self.held.stop()

    def still_mine(self, deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries whose lease is still held; the others (lost by renewal, or expired
        while waiting in the prefetch buffer) are reported and not run."""
        now = clock.now()
        mine, lost = [], []
        for d in deliveries:
            expires = d.message.lease_expires_at
            if d.lease_lost or (expires is not None and expires <= now):
                lost.append(d)
            else:
                mine.append(d)
        if lost:
            lost_before = LeaseLost("lease lost or expired before the receiver ran")
            self.outcomes.lease_lost(lost, lost_before)
        return mine

    def run_unit(self, plan: Plan, unit: list[Delivery]) -> None:
        if plan.batch:
            self.run_batch(plan, unit)
        else:
            for d in unit:
                self.run_single(plan, d)

    def run_single(self, plan: Plan, delivery: Delivery) -> None:
        if not self.still_mine([delivery]):
            return
        message = delivery.message
        if self.outcomes.exhausted(delivery):
            self.outcomes.give_up([delivery], None)
            return
        try:
            spec = self.config.registry.route(plan.specs, message)
        except NoReceiver as exc:  # another release's receiver: give it back
            self.outcomes.unmatched([delivery], exc, plan.specs)
            return
        self.execute(spec, [delivery])

    def run_batch(self, plan: Plan, deliveries: list[Delivery]) -> None:
        todo = []
        for d in self.still_mine(deliveries):
            if self.outcomes.exhausted(d):
                self.outcomes.give_up([d], None)
            else:
                todo.append(d)
        groups: dict[str, tuple[ReceiverSpec, list[Delivery]]] = {}
        unmatched: list[Delivery] = []
        miss: NoReceiver | None = None
        for d in todo:
            try:
                spec = self.config.registry.route(plan.specs, d.message)
            except NoReceiver as exc:  # another release's receiver: give it back
                unmatched.append(d)
                miss = exc
                continue
            groups.setdefault(spec.name, (spec, []))[1].append(d)
        if miss is not None:
            self.outcomes.unmatched(unmatched, miss, plan.specs)
        for spec, group in groups.values():
            size = spec.max_batch_size or self.config.batch_size
            for i in range(0, len(group), size):
                self.execute(spec, group[i : i + size])

    def execute(self, spec: ReceiverSpec, deliveries: list[Delivery]) -> None:
        model = deliveries[0].model
        db, engine, _ = self.held.cached(model)
        retries = engine.params.transaction_retries
        limit = self.limits.limit_for(spec.timeout)
        started = time.monotonic()
        for d in deliveries:
            self.events.emit("started", message=d.message, receiver=spec.name)

        by_key = {(d.message.queue, d.message.key): d for d in deliveries}

        def lease(message: Message) -> Message:
            """The lease held now (renewed), for the receiver's code (``context.lease``)."""
            with self.held.renew_lock:
                return by_key[(message.queue, message.key)].message

        def freeze(message: Message) -> Message:
            """The lease held now, for an ack by the receiver's code: no longer renewed."""
            return self.held.freeze([by_key[(message.queue, message.key)]])[0]

        context = MessageContext(
            spec,
            [d.message for d in deliveries],
            worker_id=self.events.worker_id,
            deadline=started + limit if limit is not None else None,
            lease=lease,
            freeze=freeze,
            stopping=lambda: self.held.stopping,
        )

        def body() -> None:
            with self.held.renew_lock:  # (again on a retried transaction: renew while it runs)
                for d in deliveries:
                    d.acking = False
            context._restart()  # (again on a retried transaction: its acks rolled back)
            with self.limits.running(deliveries, limit):
                call(spec, context)
            if any(d.timed_out for d in deliveries):  # returned late: never acked
                raise TimeLimitExceeded(f"{spec.name} ran past its time limit of {limit} s")
            if spec.atomic:
                self.ack(deliveries, db, context)

        try:
            with running(context):
                if spec.atomic:
                    run_in_transaction(body, using=db, retries=retries)
                else:
                    body()  # outside any transaction: external side effects, then ack
                    run_in_transaction(
                        lambda: self.ack(deliveries, db, context), using=db, retries=retries
                    )
        except Retry as exc:
            self.outcomes.retry(deliveries, exc, spec, time.monotonic() - started)
        except TimeLimitExceeded as exc:
            self.outcomes.failed(deliveries, exc, spec, time.monotonic() - started)
            # the interrupt may have landed anywhere in the receiver's database code: start
            # this thread's next message on fresh connections
            connections.close_all()
        except LeaseLost as exc:
            self.outcomes.lease_lost(deliveries, exc, time.monotonic() - started)
        except MessageAlreadyAcked as exc:
            duration = time.monotonic() - started
            self.events.count("already_acked", len(deliveries))
            for d in deliveries:
                logger.warning(
                    "%s: already acked by someone else (its lease had expired); this "
                    "delivery's transaction was rolled back",
                    d.message,
                    extra=self.events.log_extra("already_acked", d.message, duration),
                )
                self.events.emit(
                    "already_acked",
                    message=d.message,
                    receiver=spec.name,
                    duration=duration,
                    error=exc,
                )
        except Exception as exc:
            duration = time.monotonic() - started
            if isinstance(exc, AckedFailure) and not spec.atomic:  # failure recorded, acked
                self.outcomes.failed(deliveries, exc.error, spec, duration, acked=True)
            else:
                self.outcomes.failed(deliveries, exc, spec, duration)
        else:
            duration = time.monotonic() - started
            self.events.count("processed", len(deliveries))
            debug = logger.isEnabledFor(logging.DEBUG)  # no log record built per message else
            for d in deliveries:
                if debug:
                    logger.debug(
                        "%s attempt %d acked (%s, %.3f s)",
                        d.message,
                        d.message.attempt,
                        spec.name,
                        duration,
                        extra=self.events.log_extra("acked", d.message, duration),
                    )
                self.events.emit("acked", message=d.message, receiver=spec.name, duration=duration)

    def ack(self, deliveries: list[Delivery], db: str, context: MessageContext) -> None:
        """Ack in the current transaction, unless a lease was lost (then raise LeaseLost);
        the messages the receiver's code acked itself (``context.acked``) are done."""
        lost = [d for d in deliveries if d.lease_lost]
        if lost:
            raise LeaseLost(f"{lost[0].message}: lease lost while the receiver ran; not acked.")
        # the lease held now (renewed)
        pending = [m for m in self.held.freeze(deliveries) if not context.acked(m)]
        model = deliveries[0].model
        self.outcomes.ack(model, pending, using=db)


def recycle_connections() -> None:
    """Between messages: Django's ``close_old_connections()`` (close connections that are
    broken, left in a bad state, or older than ``CONN_MAX_AGE``), except that
    ``CONN_MAX_AGE = 0`` ("close after each request") keeps a healthy connection for the
    thread's life: a message is not a request, and reconnecting per message costs a new
    client per message (on Spanner a new client, session and maintenance thread each time).
    A connection found lost (``transactions.forget_lost_connection``) is closed."""
    close_lost_connections()
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
