"""The delivery policy: what happens to a message after its receiver ran (or could not run).

One place for it, built on the engine's storage verbs (``engines/base.py``): the engine stores,
leases and deletes; ``DeliveryPolicy`` decides back-off, attempts, giving back, retry and
discard. A run returns an ``Outcome`` per message (its ``Kind``: acked, retry, failed, timed
out, lease lost, already acked; before a run: unmatched, exhausted; ``outcomes_of`` an error),
and one function, ``Outcomes.settle``, applies the policy to outcomes (logs, events, dead
letters) — Oban's executor and procrastinate's ``RetryDecision`` are the models. An ack decided
inside the receiver's transaction is made there (the worker's ``_run``): ``ACKED`` only
reports it.

- ``raise Retry(after=...)``: the message is acked and sent again under the same key, due
  ``after`` later (default: the back-off), in one transaction (``DeliveryPolicy.retry``).
- Any other exception: the failure is counted (``DeliveryPolicy.fail``); past ``max_attempts``
  the message moves to its dead-letter queue, or is dropped (logged) with
  ``discard_after_max_attempts``; else it is given back due after the back-off
  (``DeliveryPolicy.give_back``; engines that cannot release leave it to its lease expiry).
- A message no receiver of this worker matches (``NoReceiver``: in a rolling deploy, a newer
  release's ``match=`` receiver this older worker lacks): given back due after its back-off
  without spending an attempt (``DeliveryPolicy.retry``: acked and sent again under its key in
  one transaction, so its attempt count and recorded failures start again), and warned of once
  per (queue, kind of miss) as a deployment mismatch; never failed, dead-lettered or
  discarded for it.
- A message whose lease was lost is not acked, retried, released or dead-lettered; one acked
  by someone else meanwhile (``MessageAlreadyAcked``) is reported, its run rolled back.
- ``AckedFailure`` from a non-atomic receiver (the Tasks runner's ``FAILED``): the run is
  counted, logged and reported as failed; the receiver acked the message, nothing else is done.
- At stop, prefetched messages never started are given back
  (``DeliveryPolicy.return_unstarted``).

The policy branches on ``engine.features.supports_*`` only (release, attempt counting).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from functools import partial
from typing import TYPE_CHECKING, Any

from spanner_queues import clock
from spanner_queues.deadletter import dead_letter
from spanner_queues.exceptions import (
    AckedFailure,
    InvalidMessage,
    LeaseLost,
    MessageAlreadyAcked,
    MessageAlreadyExists,
    Retry,
    TimeLimitExceeded,
)
from spanner_queues.message import LATEST_DELIVER_TIME, Message, OutgoingMessage, may_have_failed
from spanner_queues.options import queue_options
from spanner_queues.receivers import NoReceiver, ReceiverSpec
from spanner_queues.signals import messages_acked, messages_sent, send_on_commit
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine
    from spanner_queues.models import Queue
    from spanner_queues.worker.events import Reporter
    from spanner_queues.worker.leases import Leases
    from spanner_queues.worker.slots import Delivery, Plan

logger = logging.getLogger("spanner_queues.worker")

#: where a message whose key clashes in its dead-letter queue waits for an operator
PARKED_UNTIL = datetime(8999, 1, 1, tzinfo=dt_timezone.utc)

#: at most this many (queue, kind of miss) pairs are remembered for the once-only warning
MISMATCHES_REMEMBERED = 1000
#: at most this many unmatched messages' miss counts are remembered (their back-off grows)
MISSES_REMEMBERED = 10_000


@dataclass(frozen=True, slots=True)
class Failure:
    """What ``DeliveryPolicy.fail`` decided about a failed run: the number of the attempt that
    failed, and whether it was the last one allowed (``QueueMeta.max_attempts``): then the
    message is dead-lettered or discarded, else given back due after the back-off."""

    attempt: int | None
    exhausted: bool


class Unstarted(enum.Enum):
    """What ``DeliveryPolicy.return_unstarted`` did with a message that was never run."""

    #: given back, due now
    RETURNED = "returned"
    #: to be run now (giving it back would spend an attempt that never ran)
    RUN = "run"
    #: kept: left to its lease expiry (the engine cannot give back)
    KEPT = "kept"


class DeliveryPolicy:
    """Back-off, attempts, giving back, retry and discard for the queues of one engine, on the
    engine's storage verbs (``ack_many``, ``requeue``, ``release``, ``record_failure``).
    Cheap to make: it holds the engine and nothing else. Its acks and re-sends send the verbs'
    signals on commit (``messages_acked``, ``messages_sent``), as the verbs' do: an ack is
    counted on that one channel, whoever made it."""

    __slots__ = ("engine",)

    def __init__(self, engine: BaseQueueEngine) -> None:
        self.engine = engine

    def backoff(self, message: Message) -> timedelta:
        """How long a message waits before its next delivery after ``message.attempt`` failed
        (``SPANNER_QUEUES[alias]["OPTIONS"]["BACKOFF"]``; hourly once it is old)."""
        age = clock.now() - (message.send_time or clock.now())
        return self.engine.params.backoff.delay(max(message.attempt or 1, 1), age)

    @staticmethod
    def exhausted(model: type[Queue], message: Message) -> bool:
        """Whether ``message`` was delivered more often than ``QueueMeta.max_attempts`` allows
        (runs lost to lease expiry count): it must not run again."""
        limit = queue_options(model).max_attempts
        return bool(limit and (message.attempt or 0) > limit)

    def ack(self, model: type[Queue], messages: Sequence[Message], *, using: str) -> None:
        """Ack received messages in the caller's transaction with the leases they carry
        (``ack_many``: ``StaleAck`` where the engine checks leases and a row no longer holds
        its token; a message without a token is acked by key; the failures recorded of them go
        with them). All or nothing; on failure the caller's transaction is marked for
        rollback."""
        if not messages:
            return
        self.engine.ack_many(
            model, [m.key for m in messages], using=using, lease_tokens=_tokens(messages)
        )
        send_on_commit(messages_acked, model, messages, using)

    def fail(
        self, model: type[Queue], message: Message, error: BaseException | None, *, using: str
    ) -> Failure:
        """Count a failed run of ``message`` (``record_failure``, in a transaction of its own;
        if that fails, it is logged and the delivery's attempt number stands) and say whether
        it was the last attempt allowed."""
        engine = self.engine
        attempt: int | None
        try:
            attempt = run_in_transaction(
                lambda: engine.record_failure(model, message, error, using=using),
                using=using,
                retries=engine.params.transaction_retries,
            )
        except Exception:
            logger.exception("%s: recording the failure failed", message)
            attempt = message.attempt
        limit = queue_options(model).max_attempts
        return Failure(
            attempt=attempt, exhausted=bool(limit and attempt is not None and attempt >= limit)
        )

    def give_back(
        self, model: type[Queue], message: Message, *, deliver_time: datetime | None = None
    ) -> bool:
        """Give a held message back before its lease ends, due at ``deliver_time`` (default:
        after the back-off for its attempt). False where the engine cannot release
        (``supports_release``): the message then comes back after its lease. ``LeaseLost`` if
        the lease is no longer held."""
        if not self.engine.features.supports_release:
            return False
        due = deliver_time or clock.now() + self.backoff(message)
        self.engine.release(model, message, deliver_time=due)
        return True

    def return_unstarted(self, model: type[Queue], message: Message, *, using: str) -> Unstarted:
        """Give back a received message that was never run, due now, without spending one of
        its attempts (the delivery counted one; enough graceful stops would otherwise
        dead-letter a message that never ran):

        - engines that count deliveries: a first delivery is acked and sent again under its
          key in one transaction (``requeue``: attempts back to 0); a later one (it failed
          before) is to be run now (``RUN``), so that its attempt is one that ran;
        - the others (attempts are failed runs, not deliveries): released due now, or
          ``KEPT`` (left to its lease expiry) where the engine cannot release.
        """
        engine = self.engine
        if not engine.features.supports_attempt_count:
            given = self.give_back(model, message, deliver_time=clock.now())
            return Unstarted.RETURNED if given else Unstarted.KEPT
        if may_have_failed(message):
            return Unstarted.RUN
        again = OutgoingMessage(key=message.key_dict, payload=message.stored_payload)
        run_in_transaction(
            lambda: self._requeue(model, [message], [again], using=using),
            using=using,
            retries=engine.params.transaction_retries,
        )
        return Unstarted.RETURNED

    def _requeue(
        self,
        model: type[Queue],
        messages: Sequence[Message],
        again: Sequence[OutgoingMessage],
        *,
        using: str,
    ) -> list[Message]:
        """Ack ``messages`` and send ``again`` in the caller's transaction (``requeue``), with
        the verbs' signals on commit."""
        sent = self.engine.requeue(model, messages, again, using=using)
        send_on_commit(messages_sent, model, sent, using)
        send_on_commit(messages_acked, model, messages, using)
        return sent

    def retry(
        self,
        model: type[Queue],
        messages: Sequence[Message],
        *,
        after: timedelta | None,
        using: str,
    ) -> list[Message]:
        """``raise Retry(after=...)``: ``requeue`` each message under its key with its
        payload, due ``after`` from now (default: after its back-off), in the caller's
        transaction."""
        now = clock.now()
        again = []
        for m in messages:
            due = now + (after if after is not None else self.backoff(m))
            if due > LATEST_DELIVER_TIME:
                raise InvalidMessage(
                    f"{m}: retry due {due}, after {LATEST_DELIVER_TIME:%Y-%m-%d}, the latest a "
                    "queue accepts."
                )
            again.append(
                OutgoingMessage(key=m.key_dict, payload=m.stored_payload, deliver_time=due)
            )
        return self._requeue(model, messages, again, using=using)

    def discard(self, model: type[Queue], messages: Sequence[Message], *, using: str) -> None:
        """Drop messages whose attempts are exhausted (``discard_after_max_attempts``) in the
        caller's transaction: ack them as ``ack`` does (their recorded failures go with
        them, the failed run just recorded included)."""
        self.ack(model, messages, using=using)


def _tokens(messages: Sequence[Message]) -> list[str | None]:
    return [m.lease_token for m in messages]


class Kind(enum.Enum):
    """How one delivery's run (or its try to run) ended: what ``Outcomes.settle`` acts on."""

    #: the message is acked (by the worker in the run's transaction, or by the receiver)
    ACKED = "acked"
    #: ``raise Retry``: ack and send again under its key, due ``after`` later
    RETRY = "retried"
    #: the receiver raised: count the failure, give it back or give up on it
    FAILED = "failed"
    #: the receiver ran past its time limit: settled as ``FAILED``
    TIMED_OUT = "timed_out"
    #: the receiver could not be interrupted: the watchdog settles it as ``FAILED`` (the
    #: run's own ``FAILED``/``TIMED_OUT`` of a stuck delivery is then nothing more)
    STUCK = "stuck"
    #: the lease was lost (renewal, expiry, a stale ack): nothing is done to the message
    LEASE_LOST = "lease_lost"
    #: someone else acked the message while the receiver ran: reported
    ALREADY_ACKED = "already_acked"
    #: no receiver of this worker matches it: given back without spending an attempt
    UNMATCHED = "unmatched"
    #: delivered more often than ``max_attempts`` allows: not run, given up on
    EXHAUSTED = "exhausted"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The outcome of one delivery: a run returns one per message (a batch, one per message
    of the batch), and ``Outcomes.settle`` applies the delivery policy to it."""

    kind: Kind
    delivery: Delivery
    #: the receiver that ran (None: none ran)
    receiver: str | None = None
    #: seconds the receiver ran (None: it did not run, or the receiver acked it itself)
    duration: float | None = None
    #: what the run raised (``Retry``, the failure, ``LeaseLost``, ``NoReceiver``...)
    error: BaseException | None = None
    #: ``RETRY``: due this long from now (None: after the back-off)
    after: timedelta | None = None
    #: ``FAILED``: the receiver acked the message itself (``AckedFailure``): nothing is done
    acked: bool = False


def outcomes_of(
    error: Exception,
    deliveries: Sequence[Delivery],
    receiver: str,
    duration: float,
    *,
    atomic: bool,
) -> list[Outcome]:
    """The outcome of each of ``deliveries`` whose run raised ``error`` (procrastinate's
    ``get_retry_decision``): ``Retry``, a time limit, a lost lease (``StaleAck`` too), an ack
    by someone else, ``AckedFailure`` of a non-atomic receiver, any other failure."""
    after: timedelta | None = None
    acked = False
    if isinstance(error, Retry):
        kind, after = Kind.RETRY, error.after
    elif isinstance(error, TimeLimitExceeded):
        kind = Kind.TIMED_OUT
    elif isinstance(error, LeaseLost):
        kind = Kind.LEASE_LOST
    elif isinstance(error, MessageAlreadyAcked):
        kind = Kind.ALREADY_ACKED
    elif isinstance(error, AckedFailure) and not atomic:  # failure recorded, acked
        kind, error, acked = Kind.FAILED, error.error, True  # type: ignore[assignment]
    else:
        kind = Kind.FAILED
    return [Outcome(kind, d, receiver, duration, error, after, acked) for d in deliveries]


class Outcomes:
    """Settles outcomes with the delivery policy (``settle``), reporting through a
    ``Reporter`` and writing leases through ``Leases``; also gives back at stop what was never
    started (``return_unstarted``). ``gone`` is called when a message left its queue for good
    (dead-lettered, discarded: a periodic schedule may need its seed again)."""

    def __init__(self, reporter: Reporter, leases: Leases, *, gone: Callable[[], None]) -> None:
        self.reporter = reporter
        self.leases = leases
        self._gone = gone
        #: (queue, kind of miss) pairs already warned of (``unmatched``)
        self.mismatches: set[tuple[str, str]] = set()
        #: (queue, key) -> times no receiver of this worker matched it, least recent first
        self.misses: OrderedDict[tuple[str, tuple[Any, ...]], int] = OrderedDict()
        self._mismatch_lock = threading.Lock()

    # --- the one entry: settle outcomes ----------------------------------------------------
    def settle(self, outcomes: Sequence[Outcome]) -> None:
        """Apply the delivery policy to ``outcomes``: those of one kind and queue (and, for
        ``RETRY``, one ``after``) together, kinds in the order they first came. A ``RETRY``
        group is acked and sent again in one transaction. ``ACKED`` outcomes were acked
        already (in the run's transaction, which is how an ack stays atomic with the
        receiver's writes): they are counted and reported."""
        groups: dict[tuple[Kind, str, timedelta | None], list[Outcome]] = {}
        for o in outcomes:
            key = (o.kind, o.delivery.plan.label, o.after)
            groups.setdefault(key, []).append(o)
        for (kind, _, _), group in groups.items():
            if kind is Kind.ACKED:
                self._acked(group)
            elif kind is Kind.RETRY:
                self._retry(group)
            elif kind in (Kind.FAILED, Kind.TIMED_OUT, Kind.STUCK):
                # a stuck run was settled when the worker gave up on it (Kind.STUCK)
                self.failed([o for o in group if kind is Kind.STUCK or not o.delivery.stuck])
            elif kind is Kind.LEASE_LOST:
                for o in group:
                    self.lease_lost([o.delivery], o.error or LeaseLost(), o.duration)
            elif kind is Kind.ALREADY_ACKED:
                self._already_acked(group)
            elif kind is Kind.UNMATCHED:
                error = group[0].error
                assert isinstance(error, NoReceiver)
                self._unmatched([o.delivery for o in group], error)
            else:  # EXHAUSTED
                self.give_up([o.delivery for o in group], None)

    def _acked(self, group: list[Outcome]) -> None:
        reporter = self.reporter
        reporter.count("processed", len(group))
        debug = logger.isEnabledFor(logging.DEBUG)  # no log record built per message else
        for o in group:
            m = o.delivery.message
            if debug:
                logger.debug(
                    "%s attempt %d acked (%s)",
                    m,
                    m.attempt,
                    o.receiver,
                    extra=reporter.log_extra("acked", m, o.duration),
                )
            reporter.emit("acked", message=m, receiver=o.receiver, duration=o.duration)

    def _retry(self, group: list[Outcome]) -> None:
        first = group[0]
        exc, duration = first.error, first.duration
        assert isinstance(exc, Retry)
        by_delivery = {id(o.delivery): o for o in group}
        deliveries = [o.delivery for o in group]
        mine = self._resend(deliveries, exc, after=exc.after, not_done="retried", duration=duration)
        if not mine:
            return
        self.reporter.count("retried", len(mine))
        for d in mine:
            o = by_delivery[id(d)]
            logger.info(
                "%s attempt %d: retry after %s%s",
                d.message,
                d.message.attempt,
                exc.after,
                f" ({exc.reason})" if exc.reason else "",
                extra=self.reporter.log_extra("retried", d.message, o.duration),
            )
            self.reporter.emit(
                "retried", message=d.message, receiver=o.receiver, duration=o.duration
            )

    def _already_acked(self, group: list[Outcome]) -> None:
        """Someone else acked the messages while the receiver ran (their lease had expired):
        the run's transaction rolled back; reported, nothing else is done."""
        self.reporter.count("already_acked", len(group))
        for o in group:
            m = o.delivery.message
            logger.warning(
                "%s: already acked by someone else (its lease had expired); this "
                "delivery's transaction was rolled back",
                m,
                extra=self.reporter.log_extra("already_acked", m, o.duration),
            )
            self.reporter.emit(
                "already_acked", message=m, receiver=o.receiver, duration=o.duration, error=o.error
            )

    # --- at stop: what was never started ---------------------------------------------------
    def return_unstarted(self, unit: list[Delivery]) -> list[Delivery]:
        """At stop: give back prefetched messages that were not started, due now, without
        spending one of their attempts (``DeliveryPolicy.return_unstarted``: the claim counted
        one; a release would keep it, and enough graceful stops would then dead-letter a
        message that never ran). Returns the deliveries to run now (a later delivery, which
        failed before, so that its attempt is one that ran; and those whose lease was lost: to
        be reported by the run)."""
        run_now = []
        for d in unit:
            plan = d.plan

            def give_back(d: Delivery = d, plan: Plan = plan) -> Unstarted | None:
                if d.lease_lost:
                    return None
                return plan.policy.return_unstarted(plan.model, d.message, using=plan.db)

            try:
                with self.leases.write(plan, give_back) as (_, done):
                    pass
            except (LeaseLost, MessageAlreadyAcked):
                logger.warning(
                    "%s: lease lost before it was given back",
                    d.message,
                    extra=self.reporter.log_extra("lease_lost", d.message),
                )
                continue
            except Exception:
                logger.exception(
                    "%s: giving it back failed; left to lease expiry",
                    d.message,
                    extra=self.reporter.log_extra("error", d.message),
                )
                continue
            # None: the lease was lost, reported (and not run) by the run below
            if done is None or done is Unstarted.RUN:
                run_now.append(d)
                continue
            if done is Unstarted.KEPT:
                continue  # left to its lease expiry
            self.reporter.count("returned")
            logger.debug(
                "%s: prefetched, not started; given back at stop",
                d.message,
                extra=self.reporter.log_extra("returned", d.message),
            )
            self.reporter.emit("returned", message=d.message)
        return run_now

    # --- the policy's steps ------------------------------------------------------------------
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
        (``DeliveryPolicy.retry``, one transaction; due ``after`` from now, or after the
        back-off). Returns those moved; lost leases and messages acked meanwhile are reported
        (``not_done``: what the log says was not done to them)."""
        self.leases.freeze(deliveries)
        mine = [d for d in deliveries if not d.lease_lost]
        if len(mine) < len(deliveries):
            self.lease_lost([d for d in deliveries if d.lease_lost], exc, duration)
        if not mine:
            return []
        plan = mine[0].plan

        def move() -> None:
            plan.policy.retry(plan.model, [d.message for d in mine], after=after, using=plan.db)

        try:
            run_in_transaction(move, using=plan.db, retries=plan.retries)
        except MessageAlreadyAcked as err:
            for d in mine:
                logger.warning(
                    "%s: already acked; not %s",
                    d.message,
                    not_done,
                    extra=self.reporter.log_extra("already_acked", d.message, duration),
                )
                self.reporter.emit("already_acked", message=d.message, error=err)
            return []
        except LeaseLost as err:  # StaleAck: delivered again or replaced meanwhile
            self.lease_lost(mine, err, duration)
            return []
        return mine

    def lease_lost(
        self, deliveries: list[Delivery], exc: BaseException, duration: float | None = None
    ) -> None:
        self.reporter.count("lease_lost", len(deliveries))
        for d in deliveries:
            logger.warning(
                "%s attempt %d: lease lost; not acked (it will be delivered again)",
                d.message,
                d.message.attempt,
                extra=self.reporter.log_extra("lease_lost", d.message, duration),
            )
            self.reporter.emit("lease_lost", message=d.message, error=exc)

    def failed(self, group: list[Outcome]) -> None:
        """Count, log (with the error's traceback) and report failed runs; unless the
        receiver acked a message itself (``acked``) or its lease was lost, count the delivery
        failure and give it back or give up on it."""
        if not group:
            return
        reporter = self.reporter
        reporter.count("failed", len(group))
        for o in group:
            d, m, exc = o.delivery, o.delivery.message, o.error
            logger.error(
                "%s attempt %d failed in %s: %s: %s",
                m,
                m.attempt,
                o.receiver or "(no receiver)",
                type(exc).__name__,
                exc,
                exc_info=exc,
                extra=reporter.log_extra("failed", m, o.duration),
            )
            reporter.emit(
                "failed",
                message=m,
                receiver=o.receiver,
                duration=o.duration,
                error=exc,
                acked=o.acked,
            )
            if d.lease_lost or o.acked:
                continue
            plan = d.plan
            if plan.policy.fail(plan.model, m, exc, using=plan.db).exhausted:
                self.give_up([d], exc, o.duration)
            else:
                self.release(d)

    def release(self, d: Delivery, *, deliver_time: datetime | None = None) -> None:
        """Give ``d`` back due at ``deliver_time`` (default: after its back-off), where the
        engine can; else it comes back after its lease."""
        plan = d.plan

        def give_back() -> bool:
            if d.lease_lost:
                return False
            return plan.policy.give_back(plan.model, d.message, deliver_time=deliver_time)

        try:
            with self.leases.write(plan, give_back) as (_, given):
                if given:
                    self.reporter.emit("released", message=d.message)
        except LeaseLost:
            logger.warning(
                "%s: lease lost before release",
                d.message,
                extra=self.reporter.log_extra("lease_lost", d.message),
            )
        except Exception:
            logger.exception(
                "%s: release failed; left to lease expiry",
                d.message,
                extra=self.reporter.log_extra("error", d.message),
            )

    def give_up(
        self,
        deliveries: list[Delivery],
        exc: BaseException | None,
        duration: float | None = None,
    ) -> None:
        """Past ``max_attempts``: dead-letter, discard or (neither configured) release."""
        extra = self.reporter.log_extra
        for d in deliveries:
            m = self.leases.freeze([d])[0]
            options = d.plan.options
            try:
                if not self._remove(d, m, exc, duration):
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

    def _remove(
        self, d: Delivery, m: Message, exc: BaseException | None, duration: float | None
    ) -> bool:
        """Dead-letter ``m`` (the frozen message of ``d``) or discard it, as its queue says;
        False when it says neither."""
        plan, reporter = d.plan, self.reporter
        options = plan.options
        if options.dead_letter_queue:
            dead_letter(m)
            reporter.count("dead_lettered")
            logger.error(
                "%s: %d attempts, moved to dead-letter queue %s",
                m,
                m.attempt,
                options.dead_letter_queue,
                extra=reporter.log_extra("dead_lettered", m, duration),
            )
            reporter.emit("dead_lettered", message=m, error=exc)
        elif options.discard_after_max_attempts:
            discard = partial(plan.policy.discard, plan.model, [m], using=plan.db)
            run_in_transaction(discard, using=plan.db)
            reporter.count("discarded")
            logger.error(  # (no payload bytes: they may hold personal data)
                "%s: %d attempts, discarded (discard_after_max_attempts); payload of %d bytes",
                m,
                m.attempt,
                len(m.payload),
                extra=reporter.log_extra("discarded", m, duration),
            )
            reporter.emit("discarded", message=m, error=exc)
        else:
            return False
        self._gone()  # a periodic message may have gone: re-seed
        return True

    def missed(self, message: Message) -> int:
        """Count one more miss of ``message`` (no receiver matched it); return its misses in
        this worker. At most ``MISSES_REMEMBERED`` messages are remembered, the least recently
        missed forgotten first (its back-off starts again)."""
        key = (message.queue, message.key)
        with self._mismatch_lock:
            misses = self.misses.pop(key, 0) + 1
            self.misses[key] = misses
            while len(self.misses) > MISSES_REMEMBERED:
                self.misses.popitem(last=False)
        return misses

    def _unmatched(self, deliveries: list[Delivery], exc: NoReceiver) -> None:
        """No receiver of this worker (its plan's) matches these messages: give them back
        without spending an attempt (``DeliveryPolicy.retry``: acked and sent again under their
        keys; attempts and recorded failures start again), due after a back-off that grows
        with each miss of the message in this worker (as it does with failed attempts;
        ``MISSES_REMEMBERED`` messages are remembered), and warn once per (queue, kind of
        miss)."""
        mine: list[Delivery] = []
        for d in deliveries:
            misses = self.missed(d.message)
            after = d.plan.policy.backoff(dataclass_replace(d.message, attempt=misses))
            mine += self._resend([d], exc, after=after, not_done="given back")
        if not mine:
            return
        self.reporter.count("unmatched", len(mine))
        for d in mine:
            m = d.message
            miss = miss_kind(d.plan.specs, m)
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
                    extra=self.reporter.log_extra("unmatched", m, miss=miss),
                )
            elif logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "%s: no receiver of this worker matches %s; given back",
                    m,
                    miss,
                    extra=self.reporter.log_extra("unmatched", m, miss=miss),
                )
            self.reporter.emit("unmatched", message=m, error=exc)


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
