"""Outcome policy: what happens to a message after its receiver ran (or could not run).

- ``raise Retry(after=...)``: the message is acked and sent again under the same key, due
  ``after`` later (default: the engine's back-off), in one transaction (``engine.retry``).
- Any other exception: the failure is counted (``engine.fail``); past ``max_attempts`` the
  message moves to its dead-letter queue, or is dropped (logged) with
  ``discard_after_max_attempts``; else it is given back due after the engine's back-off
  (``engine.give_back``; engines that cannot release leave it to its lease expiry).
- A message no receiver of this worker matches (``NoReceiver``: in a rolling deploy, a newer
  release's ``match=`` receiver this older worker lacks): given back due after its back-off
  without spending an attempt (``engine.retry``: acked and sent again under its key in one
  transaction, so its attempt count and recorded failures start again), and warned of once
  per (queue, kind of miss) as a deployment mismatch; never failed, dead-lettered or
  discarded for it.
- A message whose lease was lost is not acked, retried, released or dead-lettered.
- ``AckedFailure`` from a non-atomic receiver (the Tasks runner's ``FAILED``): the run is
  counted, logged and reported as failed; the receiver acked the message, nothing else is done.
- At stop, prefetched messages never started are given back (``engine.return_unstarted``).

Which of these an engine can do is the engine's business: nothing here reads its features.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from functools import partial
from typing import Any

from spanner_queues.deadletter import dead_letter
from spanner_queues.exceptions import LeaseLost, MessageAlreadyAcked, MessageAlreadyExists, Retry
from spanner_queues.message import Message
from spanner_queues.receivers import NoReceiver, ReceiverSpec
from spanner_queues.transactions import run_in_transaction
from spanner_queues.worker.events import Emitter
from spanner_queues.worker.state import Delivery, Holdings

logger = logging.getLogger("spanner_queues.worker")

#: where a message whose key clashes in its dead-letter queue waits for an operator
PARKED_UNTIL = datetime(8999, 1, 1, tzinfo=dt_timezone.utc)

#: at most this many (queue, kind of miss) pairs are remembered for the once-only warning
MISMATCHES_REMEMBERED = 1000


class Outcomes:
    """Acts on a run's outcome for the worker (see the module docstring)."""

    def __init__(self, held: Holdings, events: Emitter) -> None:
        self.held = held
        self.events = events
        #: (queue, kind of miss) pairs already warned of (``unmatched``)
        self.mismatches: set[tuple[str, str]] = set()
        self._mismatch_lock = threading.Lock()

    def return_unstarted(self, unit: list[Delivery]) -> list[Delivery]:
        """At stop: give back prefetched messages that were not started, due now, without
        spending one of their attempts (the claim counted one; a release would keep it, and
        enough graceful stops would then dead-letter a message that never ran):

        - first delivery (attempt 1): ack and send it again under its key in one transaction,
          as if it had never been received (attempts back to 0; its send time restarts);
        - a later delivery (it failed before): run it now, like in-flight work, so that its
          attempt is one that ran;
        - engines that count no attempts: release it where the engine can release, else leave
          it to its lease expiry.

        Returns the deliveries to run now (their lease lost: to be reported by the run).
        """
        run_now = []
        for d in unit:
            db, engine, _ = self.held.cached(d.model)

            def give_back(d: Delivery = d, engine: Any = engine, db: str = db) -> str | None:
                if d.lease_lost:
                    return None
                return engine.return_unstarted(d.model, d.message, using=db)

            try:
                with self.held.lease_write(d.model, give_back) as (_, done):
                    pass
            except (LeaseLost, MessageAlreadyAcked):
                logger.warning(
                    "%s: lease lost before it was given back",
                    d.message,
                    extra=self.events.log_extra("lease_lost", d.message),
                )
                continue
            except Exception:
                logger.exception(
                    "%s: giving it back failed; left to lease expiry",
                    d.message,
                    extra=self.events.log_extra("error", d.message),
                )
                continue
            # None: the lease was lost, reported (and not run) by the run below
            if done is None or done == "run":
                run_now.append(d)
                continue
            if done == "kept":
                continue  # left to its lease expiry
            self.events.count("returned")
            logger.debug(
                "%s: prefetched, not started; given back at stop",
                d.message,
                extra=self.events.log_extra("returned", d.message),
            )
            self.events.emit("returned", message=d.message)
        return run_now

    def _resend(
        self,
        deliveries: list[Delivery],
        exc: BaseException,
        *,
        after: timedelta | None,
        not_done: str,
        duration: float | None = None,
    ) -> list[Delivery]:
        """Ack and send again, under their keys, the deliveries whose lease is still held
        (``engine.retry``, one transaction; due ``after`` from now, or after the back-off).
        Returns those moved; lost leases and messages acked meanwhile are reported (``not
        done``: what the log says was not done to them)."""
        self.held.freeze(deliveries)
        mine = [d for d in deliveries if not d.lease_lost]
        if len(mine) < len(deliveries):
            self.lease_lost([d for d in deliveries if d.lease_lost], exc, duration)
        if not mine:
            return []
        model = mine[0].model
        db, engine, _ = self.held.cached(model)

        def move() -> None:
            engine.retry(model, [d.message for d in mine], after=after, using=db)

        try:
            run_in_transaction(move, using=db, retries=engine.params.transaction_retries)
        except MessageAlreadyAcked as err:
            for d in mine:
                logger.warning(
                    "%s: already acked; not %s",
                    d.message,
                    not_done,
                    extra=self.events.log_extra("already_acked", d.message, duration),
                )
                self.events.emit("already_acked", message=d.message, error=err)
            return []
        except LeaseLost as err:  # StaleAck: delivered again or replaced meanwhile
            self.lease_lost(mine, err, duration)
            return []
        return mine

    def retry(
        self, deliveries: list[Delivery], exc: Retry, spec: ReceiverSpec, duration: float
    ) -> None:
        mine = self._resend(deliveries, exc, after=exc.after, not_done="retried", duration=duration)
        if not mine:
            return
        self.events.count("retried", len(mine))
        for d in mine:
            logger.info(
                "%s attempt %d: retry after %s%s",
                d.message,
                d.message.attempt,
                exc.after,
                f" ({exc.reason})" if exc.reason else "",
                extra=self.events.log_extra("retried", d.message, duration),
            )
            self.events.emit("retried", message=d.message, receiver=spec.name, duration=duration)

    def lease_lost(
        self, deliveries: list[Delivery], exc: BaseException, duration: float | None = None
    ) -> None:
        self.events.count("lease_lost", len(deliveries))
        for d in deliveries:
            logger.warning(
                "%s attempt %d: lease lost; not acked (it will be delivered again)",
                d.message,
                d.message.attempt,
                extra=self.events.log_extra("lease_lost", d.message, duration),
            )
            self.events.emit("lease_lost", message=d.message, error=exc)

    def exhausted(self, d: Delivery) -> bool:
        return self.held.cached(d.model)[1].exhausted(d.model, d.message)

    def failed(
        self,
        deliveries: list[Delivery],
        exc: BaseException,
        spec: ReceiverSpec | None,
        duration: float | None = None,
        *,
        acked: bool = False,
    ) -> None:
        """Count, log (with ``exc``'s traceback) and report a failed run; unless the receiver
        acked the messages itself (``acked``), count the delivery failure and give them back
        or give up on them."""
        self.events.count("failed", len(deliveries))
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
                extra=self.events.log_extra("failed", m, duration),
            )
            self.events.emit(
                "failed",
                message=m,
                receiver=spec.name if spec else None,
                duration=duration,
                error=exc,
                acked=acked,
            )
            if d.lease_lost or acked:
                continue
            db, engine, _ = self.held.cached(d.model)
            if engine.fail(d.model, m, exc, using=db).exhausted:
                self.give_up([d], exc, duration)
            else:
                self.release(d)

    def release(self, d: Delivery, *, deliver_time: datetime | None = None) -> None:
        """Give ``d`` back due at ``deliver_time`` (default: after its back-off), where the
        engine can; else it comes back after its lease."""
        engine = self.held.cached(d.model)[1]

        def give_back() -> bool:
            if d.lease_lost:
                return False
            return engine.give_back(d.model, d.message, deliver_time=deliver_time)

        try:
            with self.held.lease_write(d.model, give_back) as (_, given):
                if given:
                    self.events.emit("released", message=d.message)
        except LeaseLost:
            logger.warning(
                "%s: lease lost before release",
                d.message,
                extra=self.events.log_extra("lease_lost", d.message),
            )
        except Exception:
            logger.exception(
                "%s: release failed; left to lease expiry",
                d.message,
                extra=self.events.log_extra("error", d.message),
            )

    def give_up(
        self,
        deliveries: list[Delivery],
        exc: BaseException | None,
        duration: float | None = None,
    ) -> None:
        """Past ``max_attempts``: dead-letter, discard or (neither configured) release."""
        extra = self.events.log_extra
        for d in deliveries:
            m = self.held.freeze([d])[0]
            options = self.held.cached(d.model)[2]
            try:
                if options.dead_letter_queue:
                    dead_letter(m)
                    self.events.count("dead_lettered")
                    logger.error(
                        "%s: %d attempts, moved to dead-letter queue %s",
                        m,
                        m.attempt,
                        options.dead_letter_queue,
                        extra=extra("dead_lettered", m, duration),
                    )
                    self.events.emit("dead_lettered", message=m, error=exc)
                    self.held.next_seed = 0.0  # a periodic message may have gone: re-seed
                elif options.discard_after_max_attempts:
                    db, engine, _ = self.held.cached(d.model)
                    run_in_transaction(partial(engine.discard, d.model, [m], using=db), using=db)
                    self.events.count("discarded")
                    logger.error(  # (no payload bytes: they may hold personal data)
                        "%s: %d attempts, discarded (discard_after_max_attempts); payload of "
                        "%d bytes",
                        m,
                        m.attempt,
                        len(m.payload),
                        extra=extra("discarded", m, duration),
                    )
                    self.events.emit("discarded", message=m, error=exc)
                    self.held.next_seed = 0.0
                else:
                    self.release(d)
            except MessageAlreadyAcked:
                logger.warning(
                    "%s: already acked; nothing to dead-letter",
                    m,
                    extra=extra("already_acked", m, duration),
                )
            except LeaseLost:  # StaleAck: delivered again or replaced meanwhile
                logger.warning(
                    "%s: lease lost; not dead-lettered (delivered again)",
                    m,
                    extra=extra("lease_lost", m, duration),
                )
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
                    extra=extra("dead_letter_clash", m, duration),
                )
                self.release(d, deliver_time=PARKED_UNTIL)

    def unmatched(
        self, deliveries: list[Delivery], exc: NoReceiver, specs: Sequence[ReceiverSpec]
    ) -> None:
        """No receiver in ``specs`` (this worker's, for the deliveries' queue) matches these
        messages: give them back due after their back-off without spending an attempt, in
        one transaction (``engine.retry``: acked and sent again under their keys; attempts
        and recorded failures start again), and warn once per (queue, kind of miss)."""
        mine = self._resend(deliveries, exc, after=None, not_done="given back")
        if not mine:
            return
        self.events.count("unmatched", len(mine))
        for d in mine:
            m = d.message
            miss = miss_kind(specs, m)
            with self._mismatch_lock:
                first = (m.queue, miss) not in self.mismatches
                if first and len(self.mismatches) < MISMATCHES_REMEMBERED:
                    self.mismatches.add((m.queue, miss))
            if first:
                logger.warning(
                    "%s: no receiver of this worker matches %s: a deployment mismatch? (a "
                    "receiver of another release, not deployed on this worker); given back "
                    "without spending an attempt, due after its back-off, for a worker that "
                    "has it. Logged once per queue and kind.",
                    m,
                    miss,
                    extra=self.events.log_extra("unmatched", m, miss=miss),
                )
            elif logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "%s: no receiver of this worker matches %s; given back",
                    m,
                    miss,
                    extra=self.events.log_extra("unmatched", m, miss=miss),
                )
            self.events.emit("unmatched", message=m, error=exc)


def miss_kind(specs: Sequence[ReceiverSpec], message: Message) -> str:
    """What ``message`` carries in the fields the ``match=`` of ``specs`` look at, as text
    (``"kind='refund'"``): the kind of message this worker has no receiver for."""
    names = sorted({name for spec in specs for name in (spec.match or {})})
    key = message.key_dict
    data: Any = None
    parts = []
    for name in names:
        if name in key:
            parts.append(f"{name}={key[name]!r:.80}")
            continue
        if data is None:
            try:
                data = message.json()
            except Exception:
                data = {}
        if isinstance(data, Mapping) and name in data:
            parts.append(f"{name}={data[name]!r:.80}")
        else:
            parts.append(f"no {name}")
    return ", ".join(parts) or "(no match fields)"
