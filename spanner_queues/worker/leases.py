"""Leases: ``Leases`` (the lease held now of each delivery, as an ack, a retry, a release or a
renewal reads and writes it) and ``Renewer`` (one thread that renews the leases of every
message the worker holds, running or waiting in the prefetch buffer, halfway through each
lease; every ``controls.CANCEL_CHECK_SECONDS`` it also reads the cancellations of the messages
whose receivers have run that long already, one query per database, and tells their runs:
``MessageContext.cancelled``). A renewal that loses a lease marks the delivery lost: the worker
then no longer acks, retries or releases it. A delivery whose token an ack has read
(``acking``) is left alone until the ack commits. Engines that cannot renew
(``NotSupportedByEngine``) keep the lease they gave."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections

from spanner_queues import api, clock, controls
from spanner_queues.exceptions import NotSupportedByEngine
from spanner_queues.failures import key_text
from spanner_queues.message import Message
from spanner_queues.transactions import forget_lost_connection, holding

if TYPE_CHECKING:
    from spanner_queues.worker.events import Reporter
    from spanner_queues.worker.slots import Delivery, Plan, Slots

logger = logging.getLogger("spanner_queues.worker")

T = TypeVar("T")

#: how long a renewal waits for the database's write lock held elsewhere in this process
#: before it tries again later (seconds).
LOCK_WAIT = 0.25


class Leases:
    """The leases the worker holds. ``lock`` is held by a renewal, and by whoever reads a
    delivery's lease token to ack, retry, release or dead-letter it (``freeze``), so the token
    acked with is the row's until the ack commits."""

    def __init__(self) -> None:
        self.lock = threading.RLock()

    def current(self, d: Delivery) -> Message:
        """``d``'s message with the lease held now (renewals rotate it)."""
        with self.lock:
            return d.message

    def freeze(self, deliveries: Sequence[Delivery]) -> list[Message]:
        """The deliveries' messages with the lease held now; no renewal rotates their tokens
        from here on (``acking``)."""
        with self.lock:
            for d in deliveries:
                d.acking = True
            return [d.message for d in deliveries]

    def thaw(self, deliveries: Sequence[Delivery]) -> None:
        """Renew the deliveries again (a run's transaction starts, or starts again)."""
        with self.lock:
            for d in deliveries:
                d.acking = False

    @contextlib.contextmanager
    def write(
        self, plan: Plan, write: Callable[[], T], *, wait: float | None = None
    ) -> Iterator[tuple[bool, T | None]]:
        """Run ``write()`` (a renewal, release or give-back of ``plan``'s leases) holding
        ``lock``, and keep holding it for the ``with`` block, which yields ``(True, write's
        result)`` and records the new leases: an ack reads no token in between. An ack takes
        ``lock`` inside its transaction; ``transactions.holding`` orders this write the same
        way where the database has a single write lock. ``wait``: give up (``(False, None)``,
        nothing written) when this process's write lock stays busy that long (an atomic
        receiver of this process holds it while it runs). Errors of ``write()`` and of its
        transaction are raised by the ``with`` statement."""
        with holding(self.lock, write, using=plan.db, retries=plan.retries, wait=wait) as result:
            yield result


class Renewer:
    """Renews the leases of the deliveries in ``slots`` (see the module docstring)."""

    def __init__(self, slots: Slots, leases: Leases, reporter: Reporter) -> None:
        self.slots = slots
        self.leases = leases
        self.reporter = reporter
        #: ``time.monotonic()`` of the next read of cancellations
        self.cancels_at = 0.0

    def run(self) -> None:
        """The renewer thread: until the worker stops and holds nothing."""
        slots = self.slots
        try:
            while True:
                with slots.cond:
                    if slots.drained:
                        return
                    now = clock.now()
                    live = slots.renewable()
                    due = [d for d in live if d.renew_at is not None and d.renew_at <= now]
                    running = None
                    next_cancels = 0.0
                    if time.monotonic() >= self.cancels_at:
                        # runs shorter than a check's interval are not asked: a quick
                        # receiver costs no read, a long one is asked once a second from
                        # the moment it has run one (not up to a second later)
                        clock_now = time.monotonic()
                        ran_since = clock_now - controls.CANCEL_CHECK_SECONDS
                        starts = [
                            (d.context.started, d)
                            for d in live
                            if d.context is not None and d.context.active
                        ]
                        running = [d for started, d in starts if started <= ran_since]
                        young = [started for started, _ in starts if started > ran_since]
                        next_cancels = clock_now + controls.CANCEL_CHECK_SECONDS
                        if young and not running:
                            next_cancels = min(young) + controls.CANCEL_CHECK_SECONDS
                    if not due and running is None:
                        upcoming = [d.renew_at for d in live if d.renew_at is not None]
                        wait = (min(upcoming) - now).total_seconds() if upcoming else 1.0
                        wait = min(wait, self.cancels_at - time.monotonic())
                        slots.renew_cond.wait(timeout=max(0.01, min(wait, 1.0)))
                        continue
                if running is not None:
                    self.cancels_at = next_cancels
                    if running:
                        self.check_cancels(running)
                if due:
                    self.renew(due)
        finally:
            connections.close_all()

    def check_cancels(self, running: list[Delivery]) -> None:
        """Read the cancellations of the messages of ``running`` (one query per database, per
        ``controls.CANCEL_READ_BATCH`` messages) and tell each cancelled one's run. A failed
        read is logged and tried again at the next check."""
        by_db: dict[str, list[Delivery]] = {}
        for d in running:
            cancelled = d.context is None or d.context.cancelled
            if not cancelled:
                by_db.setdefault(d.plan.db, []).append(d)
        for db, group in by_db.items():
            try:
                found = controls.cancellations(
                    [
                        (d.plan.label, d.message.key, d.message.send_time, d.received_at)
                        for d in group
                    ],
                    using=db,
                )
            except Exception as exc:
                forget_lost_connection(exc, db)
                logger.exception("reading cancellations failed; trying again")
                continue
            if not found:
                continue
            for d in group:
                row = found.get((d.plan.label, key_text(d.message.key)))
                if row is not None and d.context is not None:
                    d.context._cancel(row.reason, row.by)
                    logger.info(
                        "%s: cancelled by %s (%s); its receiver is asked to stop",
                        d.message,
                        row.by or "an operator",
                        row.reason,
                        extra=self.reporter.log_extra("cancel_requested", d.message),
                    )
                    self.reporter.emit("cancel_requested", message=d.message)

    def renew(self, due: list[Delivery]) -> None:
        by_plan: dict[str, list[Delivery]] = {}
        for d in due:
            by_plan.setdefault(d.plan.label, []).append(d)
        for group in by_plan.values():
            self._renew(group[0].plan, group)

    def _renew(self, plan: Plan, group: list[Delivery]) -> None:
        def renewal() -> tuple[list[Delivery], list[Any]]:
            live = [d for d in group if d.renewable]
            return live, (api.renew_many([d.message for d in live]) if live else [])

        try:
            with self.leases.write(plan, renewal, wait=LOCK_WAIT) as (got, result):
                if not got or result is None:
                    # The database's write lock is busy in this process (SQLite: an atomic
                    # receiver holds it while it runs; nobody can claim its rows meanwhile):
                    # try again shortly, holding nothing an ack needs.
                    later = clock.now() + timedelta(seconds=LOCK_WAIT)
                    for d in group:
                        d.renew_at = later
                    return
                live, renewed = result
                by_key = {m.key: m for m in renewed}
                now = clock.now()
                for d in live:
                    new = by_key.get(d.message.key)
                    if new is None:
                        self.mark_lost(d)
                    else:
                        d.message = new
                        d.renew_at = renew_at(new, now)
                        self.reporter.emit("renewed", message=new)
        except NotSupportedByEngine:  # the lease is what it is: no renewal
            for d in group:
                d.renew_at = None
        except Exception as exc:
            forget_lost_connection(exc, plan.db)  # reconnect next time
            logger.exception("lease renewal failed; trying again")
            now = clock.now()
            for d in group:
                expires = d.message.lease_expires_at
                if expires is not None and expires <= now:
                    self.mark_lost(d)
                else:
                    d.renew_at = now + timedelta(milliseconds=200)

    def mark_lost(self, d: Delivery) -> None:
        d.lease_lost = True
        logger.warning(
            "%s attempt %d: lease renewal failed; the message is no longer this worker's",
            d.message,
            d.message.attempt,
            extra=self.reporter.log_extra("lease_lost", d.message),
        )
        self.reporter.emit("renewal_failed", message=d.message)


def renew_at(message: Message, now: datetime) -> datetime | None:
    """Halfway through the remaining lease (Spanner extends by 10 s: renew every ~5 s)."""
    if message.lease_expires_at is None:
        return None
    return now + (message.lease_expires_at - now) / 2
