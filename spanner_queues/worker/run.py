"""The run station: the deliveries of a unit go through their receivers and come out as
``Outcome`` values (``Runner``). A unit's deliveries that are not to run (lease lost or expired,
exhausted, unmatched) come out at once (``_route``); the others run by receiver (``_run``: in
the receiver's transaction with its ack when ``atomic``), and ``Outcomes.settle`` applies the
delivery policy to what came out. The ``Runner`` holds narrow handles, never the ``Worker``: the
registry, the leases, the time limits, the reporter, the slots (``stopping``) and the
outcomes."""

from __future__ import annotations

import logging
import time
from functools import partial

from django.db import connections

from spanner_queues import clock
from spanner_queues.exceptions import AckedFailure, LeaseLost, TimeLimitExceeded
from spanner_queues.message import Message
from spanner_queues.receivers import (
    MessageContext,
    NoReceiver,
    ReceiverRegistry,
    ReceiverSpec,
    call,
    running,
)
from spanner_queues.transactions import run_in_transaction
from spanner_queues.worker.apply import DeliveryPolicy, Outcomes
from spanner_queues.worker.events import Reporter
from spanner_queues.worker.leases import Leases
from spanner_queues.worker.limits import TimeLimits, time_limit_exceeded
from spanner_queues.worker.outcomes import Kind, Outcome, outcomes_of
from spanner_queues.worker.slots import Delivery, Plan, Slots, Unit

logger = logging.getLogger("spanner_queues.worker")


class Runner:
    """Runs units of deliveries through their receivers (``_run_unit``) and settles what came
    out (``Outcomes.settle``)."""

    def __init__(
        self,
        *,
        registry: ReceiverRegistry,
        worker_id: str,
        batch_size: int,
        slots: Slots,
        leases: Leases,
        reporter: Reporter,
        outcomes: Outcomes,
        time_limits: TimeLimits,
    ) -> None:
        self.registry = registry
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.slots = slots
        self.leases = leases
        self.reporter = reporter
        self.outcomes = outcomes
        self.time_limits = time_limits

    def _run_unit(self, plan: Plan, unit: Unit) -> None:
        """Run one unit: the deliveries whose lease is still held, not exhausted
        (``max_attempts``: given up on) and routed to a receiver (``NoReceiver``: given back);
        a batch in groups per receiver of at most its batch size. Each run's outcomes are
        settled (``Outcomes.settle``) once it returns."""
        before, groups = self._route(plan, unit)
        self.outcomes.settle(before)
        for spec, group in groups:
            size = (spec.max_batch_size or self.batch_size) if plan.batch else 1
            for i in range(0, len(group), size):
                self.outcomes.settle(self._run(plan, spec, group[i : i + size]))

    def _route(
        self, plan: Plan, unit: Unit
    ) -> tuple[list[Outcome], list[tuple[ReceiverSpec, list[Delivery]]]]:
        """The outcomes of the deliveries of ``unit`` that are not to run (lease lost or
        expired, exhausted, unmatched), and the others by receiver."""
        now = clock.now()
        before: list[Outcome] = []
        groups: dict[str, tuple[ReceiverSpec, list[Delivery]]] = {}
        lost_before = LeaseLost("lease lost or expired before the receiver ran")
        for d in unit:
            expires = d.message.lease_expires_at
            if d.lease_lost or (expires is not None and expires <= now):
                # lost by renewal, or expired waiting in the prefetch buffer
                before.append(Outcome(Kind.LEASE_LOST, d, error=lost_before))
                continue
            if DeliveryPolicy.exhausted(plan.model, d.message):
                before.append(Outcome(Kind.EXHAUSTED, d))
                continue
            try:
                spec = self.registry.route(plan.specs, d.message)
            except NoReceiver as exc:  # another release's receiver: give it back
                before.append(Outcome(Kind.UNMATCHED, d, error=exc))
                continue
            groups.setdefault(spec.name, (spec, []))[1].append(d)
        return before, list(groups.values())

    def _run(self, plan: Plan, spec: ReceiverSpec, deliveries: list[Delivery]) -> list[Outcome]:
        """Run ``spec``'s receiver on ``deliveries`` and ack them, in its transaction when it is
        ``atomic`` (the ack commits with the receiver's writes, or neither does). Returns one
        outcome per delivery (``outcomes_of`` an error); ``Outcomes.settle`` acts on them. A
        ``BaseException`` that is not an ``Exception`` goes up (``_crash``)."""
        limit = plan.time_limit(spec, [d.message for d in deliveries])  # (None: no limit)
        started = time.monotonic()
        for d in deliveries:
            self.reporter.emit("started", message=d.message, receiver=spec.name)
        context = self._context(spec, deliveries, started, limit)
        own: list[Outcome] = []  # acked by the receiver's own code before it raised
        try:
            with running(context):
                if spec.atomic:
                    run_in_transaction(
                        lambda: self._call(plan, spec, deliveries, context, limit),
                        using=plan.db,
                        retries=plan.retries,
                    )
                else:
                    try:
                        self._call(plan, spec, deliveries, context, limit)
                    except AckedFailure:
                        raise  # acked and failed, as the receiver says (the Tasks runner)
                    except Exception:
                        own, deliveries = self._own_acks(spec, deliveries, context)
                        if not deliveries:  # no message to fail: the error is only logged
                            logger.exception(
                                "%s raised after acking all its messages itself; the acks stand",
                                spec.name,
                                extra={"action": "error", "queue": plan.label},
                            )
                            return own
                        raise  # the outcome below is the others'
                    if any(d.lease_lost or not context.acked(d.message) for d in deliveries):
                        ack = partial(self._ack, plan, deliveries, context)
                        run_in_transaction(ack, using=plan.db, retries=plan.retries)
                    # (else the receiver acked them all itself: no transaction of ours, which
                    # on SQLite would wait for the write lock its acks hold: the relay's)
        except Exception as exc:
            if isinstance(exc, TimeLimitExceeded):
                # the interrupt may have landed anywhere in the receiver's database code:
                # start this thread's next message on fresh connections
                connections.close_all()
            duration = time.monotonic() - started
            return own + outcomes_of(exc, deliveries, spec.name, duration, atomic=spec.atomic)
        duration = time.monotonic() - started
        self.reporter.count("commits")
        self.reporter.emit("committed", queue=plan.label, size=len(deliveries))
        return [Outcome(Kind.ACKED, d, spec.name, duration) for d in deliveries]

    def _context(
        self,
        spec: ReceiverSpec,
        deliveries: list[Delivery],
        started: float,
        limit: float | None,
        *,
        grouped: bool = False,
    ) -> MessageContext:
        """The receiver's ``MessageContext``: the leases held now, and an ack by its own code
        freezes the lease it acks with. The worker acks in the receiver's transaction for an
        atomic receiver and for every receiver of a group (``grouped``)."""
        by_key = {(d.message.queue, d.message.key): d for d in deliveries}
        leases = self.leases

        def lease(message: Message) -> Message:
            """The lease held now (renewed), for the receiver's code (``context.lease``)."""
            return leases.current(by_key[(message.queue, message.key)])

        def freeze(message: Message) -> Message:
            """The lease held now, for an ack by the receiver's code: no longer renewed."""
            return leases.freeze([by_key[(message.queue, message.key)]])[0]

        context = MessageContext(
            spec,
            [d.message for d in deliveries],
            worker_id=self.worker_id,
            deadline=started + limit if limit is not None else None,
            lease=lease,
            freeze=freeze,
            stopping=lambda: self.slots.stopping,
            acks_in_transaction=spec.atomic or grouped,
        )
        for d in deliveries:  # (the renewer tells it of a cancellation)
            d.context = context
        return context

    def _call(
        self,
        plan: Plan,
        spec: ReceiverSpec,
        deliveries: list[Delivery],
        context: MessageContext,
        limit: float | None,
        *,
        ack: bool = True,
    ) -> None:
        """Call the receiver under its time limit (again on a retried transaction: renewed
        while it runs, its own acks rolled back); an atomic receiver's messages are acked in
        its transaction (unless ``ack`` is False: a group acks them all at once)."""
        self.leases.thaw(deliveries)
        context._restart()
        if limit is None:  # nothing interrupts it, nothing to watch
            call(spec, context)
        else:
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
        if spec.atomic and ack:
            self._ack(plan, deliveries, context)

    @staticmethod
    def _own_acks(
        spec: ReceiverSpec, deliveries: list[Delivery], context: MessageContext
    ) -> tuple[list[Outcome], list[Delivery]]:
        """A non-atomic receiver raised after acking some of its messages itself (those acks
        committed): they are ``ACKED``; the rest are returned, for the outcome of the error.
        The Pub/Sub relay acks what Pub/Sub confirmed, then fails. An ack counts once it
        committed (``context.committed``): a time limit's interrupt inside the receiver's own
        transaction rolls its ack back, one after the commit finds the message done."""
        done = [d for d in deliveries if context.committed(d.message)]
        rest = [d for d in deliveries if d not in done]
        return [Outcome(Kind.ACKED, d, spec.name) for d in done], rest

    def _ack(self, plan: Plan, deliveries: list[Delivery], context: MessageContext) -> None:
        """Ack in the current transaction (``DeliveryPolicy.ack``), unless a lease was lost
        (then raise LeaseLost); the messages the receiver's code acked itself
        (``context.acked``) are done."""
        lost = [d for d in deliveries if d.lease_lost]
        if lost:
            raise LeaseLost(f"{lost[0].message}: lease lost while the receiver ran; not acked.")
        # the lease held now (renewed)
        pending = [m for m in self.leases.freeze(deliveries) if not context.acked(m)]
        plan.policy.ack(plan.model, pending, using=plan.db)
