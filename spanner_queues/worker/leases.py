"""Leases: one renewer thread renews the leases of every message the worker holds (running
or waiting in the prefetch buffer), halfway through each lease. A renewal that loses a lease
marks the delivery lost: the worker then no longer acks, retries or releases it. A delivery
whose token an ack has read (``acking``) is left alone until the ack commits. Engines that
cannot renew (``NotSupportedByEngine``) keep the lease they gave."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import connections

from spanner_queues import api, clock
from spanner_queues.exceptions import NotSupportedByEngine
from spanner_queues.transactions import forget_lost_connection
from spanner_queues.worker.events import Emitter
from spanner_queues.worker.state import Delivery, Holdings, renew_at

logger = logging.getLogger("spanner_queues.worker")

#: how long a renewal waits for the database's write lock held elsewhere in this process
#: before it tries again later (seconds).
LOCK_WAIT = 0.25


class Renewer:
    """Renews the leases of ``held.deliveries`` (see the module docstring)."""

    def __init__(self, held: Holdings, events: Emitter) -> None:
        self.held = held
        self.events = events

    def run(self) -> None:
        """The renewer thread: until the worker stops and holds nothing."""
        try:
            while True:
                with self.held.cond:
                    if self.held.stopping and self.held.in_flight <= self.held.stuck_units:
                        return
                    now = clock.now()
                    live = [
                        d
                        for d in self.held.deliveries
                        if not d.done and not d.lease_lost and not d.acking and not d.timed_out
                    ]
                    due = [d for d in live if d.renew_at is not None and d.renew_at <= now]
                    if not due:
                        upcoming = [d.renew_at for d in live if d.renew_at is not None]
                        wait = (min(upcoming) - now).total_seconds() if upcoming else 1.0
                        self.held.renew_cond.wait(timeout=max(0.01, min(wait, 1.0)))
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
                with self.held.lease_write(model, renewal, wait=LOCK_WAIT) as (got, result):
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
                            self.events.emit("renewed", message=new)
            except NotSupportedByEngine:  # the lease is what it is: no renewal
                for d in group:
                    d.renew_at = None
            except Exception as exc:
                forget_lost_connection(exc, self.held.cached(model)[0])  # reconnect next time
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
            extra=self.events.log_extra("lease_lost", d.message),
        )
        self.events.emit("renewal_failed", message=d.message)
