"""Leases: one renewer thread renews the leases of every message the worker holds (running
or waiting in the prefetch buffer), halfway through each lease. A renewal that loses a lease
marks the delivery lost: the worker then no longer acks, retries or releases it. A delivery
whose token an ack has read (``acking``) is left alone until the ack commits. Engines that
cannot renew (``NotSupportedByEngine``) keep the lease they gave."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections

from spanner_queues import api, clock
from spanner_queues.exceptions import NotSupportedByEngine
from spanner_queues.message import Message
from spanner_queues.transactions import forget_lost_connection

if TYPE_CHECKING:
    from spanner_queues.worker import Delivery, Worker

logger = logging.getLogger("spanner_queues.worker")

#: how long a renewal waits for the database's write lock held elsewhere in this process
#: before it tries again later (seconds).
LOCK_WAIT = 0.25


class Renewer:
    """Renews the leases of ``worker.deliveries`` (see the module docstring)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def run(self) -> None:
        """The renewer thread: until the worker stops and holds nothing."""
        try:
            while True:
                with self.worker.cond:
                    if self.worker.drained:
                        return
                    now = clock.now()
                    live = [
                        d
                        for d in self.worker.deliveries
                        if not d.done and not d.lease_lost and not d.acking and not d.timed_out
                    ]
                    due = [d for d in live if d.renew_at is not None and d.renew_at <= now]
                    if not due:
                        upcoming = [d.renew_at for d in live if d.renew_at is not None]
                        wait = (min(upcoming) - now).total_seconds() if upcoming else 1.0
                        self.worker.renew_cond.wait(timeout=max(0.01, min(wait, 1.0)))
                        continue
                self.renew(due)
        finally:
            connections.close_all()

    def renew(self, due: list[Delivery]) -> None:
        by_model: dict[Any, list[Delivery]] = {}
        for d in due:
            by_model.setdefault(d.model, []).append(d)
        for model, group in by_model.items():

            def renewal(group: list[Delivery] = group) -> tuple[list[Delivery], list[Any]]:
                live = [
                    d
                    for d in group
                    if not d.done and not d.lease_lost and not d.acking and not d.timed_out
                ]
                return live, (api.renew_many([d.message for d in live]) if live else [])

            try:
                with self.worker.lease_write(model, renewal, wait=LOCK_WAIT) as (got, result):
                    if not got or result is None:
                        # The database's write lock is busy in this process (SQLite: an
                        # atomic receiver holds it while it runs; nobody can claim its rows
                        # meanwhile): try again shortly, holding nothing an ack needs.
                        later = clock.now() + timedelta(seconds=LOCK_WAIT)
                        for d in group:
                            d.renew_at = later
                        continue
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
                            self.worker.emit("renewed", message=new)
            except NotSupportedByEngine:  # the lease is what it is: no renewal
                for d in group:
                    d.renew_at = None
            except Exception as exc:
                forget_lost_connection(exc, self.worker.cached(model)[0])  # reconnect next time
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
            extra=self.worker.log_extra("lease_lost", d.message),
        )
        self.worker.emit("renewal_failed", message=d.message)


def renew_at(message: Message, now: datetime) -> datetime | None:
    """Halfway through the remaining lease (Spanner extends by 10 s: renew every ~5 s)."""
    if message.lease_expires_at is None:
        return None
    return now + (message.lease_expires_at - now) / 2
